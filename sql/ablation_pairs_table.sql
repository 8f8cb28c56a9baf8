-- The ablation's paired differences between arms (a - b: adv-cand, adv-exact reward, adv-SFT, adv-mixed), pooled
-- over the seeds both ran: seed s of a against seed s of b on the same evaluation draws, with 95% intervals from a
-- hierarchical bootstrap that resamples the same seeds, conversations and turns for both sides. The primary set
-- (`ablation.primary`) first, then the other sets and the OOD probe.
select arm_a || ' - ' || arm_b as pair,
       eval_set,
       "primary",
       n_seeds,
       n,
       n_conversations,
       round(delta, 3) as delta,
       printf('[%+.3f, %+.3f]', delta_low, delta_high) as delta_ci95,
       excludes_zero
from ablation_pairs
order by "primary" desc, case eval_set when 'profiled' then 1 when 'mixed' then 2 when 'adv' then 3 else 4 end,
         case arm_b when 'grpo_cand' then 1 when 'grpo_adv_exact' then 2 when 'sft_same_data' then 3 else 4 end
