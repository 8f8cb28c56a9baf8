-- pivot_eval side by side: base model, reference (the policy that profiled), SFT warm-up, GRPO policy.
-- Accuracy on the fixed held-out sets (all profiled turns, D_mixed, D_adv; fresh evaluation draws) and the OOD
-- probe, each with its 95% bootstrap interval, and the paired difference against the reference.
select policy, eval_set, n, k,
       round(accuracy, 3) as accuracy,
       printf('[%.3f, %.3f]', ci_low, ci_high) as ci95,
       round(delta, 3) as delta_vs_reference,
       printf('[%+.3f, %+.3f]', delta_low, delta_high) as delta_ci95
from pivot_eval
order by case eval_set when 'adv' then 1 when 'mixed' then 2 when 'profiled' then 3 else 4 end,
         case when policy = 'base' then 1 when policy = 'reference' then 2 when policy = 'sft' then 3 else 4 end, policy
