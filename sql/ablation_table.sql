-- The paper's ablation table on the primary evaluation set (`ablation.primary`, named before the run): one row per
-- arm (pooled over its seeds when ablation.seeds has several, else the one seed) plus the base model and the
-- reference; accuracy on the held-out primary set and on the OOD probe, with 95% hierarchical bootstrap intervals
-- (seeds, conversations, turns) and paired differences against the reference. Arms against each other:
-- the view ablation_pairs_table.
with per_arm as (
    select *,
           row_number() over (partition by coalesce(arm, policy), eval_set order by (seed is null) desc, seed) as pick
    from ablation_results
),
one as (select * from per_arm where pick = 1)
select coalesce(a.arm, a.policy) as arm,
       case when a.seed is null and a.arm is not null then 'pooled' else coalesce(cast(a.seed as varchar), '') end as seeds,
       a.n_seeds,
       a.eval_set as primary_set,
       a.n,
       a.n_conversations,
       round(a.accuracy, 3) as accuracy,
       printf('[%.3f, %.3f]', a.ci_low, a.ci_high) as ci95,
       round(a.delta, 3) as delta,
       printf('[%+.3f, %+.3f]', a.delta_low, a.delta_high) as delta_ci95,
       o.n as n_ood,
       round(o.accuracy, 3) as ood_accuracy,
       round(o.delta, 3) as ood_delta,
       printf('[%+.3f, %+.3f]', o.delta_low, o.delta_high) as ood_delta_ci95,
       a.train_s
from one a
join one o on o.eval_set = 'ood' and coalesce(o.arm, o.policy) = coalesce(a.arm, a.policy)
where a."primary"
order by case coalesce(a.arm, a.policy) when 'base' then 1 when 'reference' then 2 when 'grpo_adv' then 3
         when 'grpo_cand' then 4 when 'grpo_mixed' then 5 when 'grpo_adv_exact' then 6 else 7 end
