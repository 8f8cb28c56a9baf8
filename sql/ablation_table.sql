-- The paper's ablation table: one row per arm (seeds pooled when ablation.seeds has several, else the one
-- seed) plus the base model and the reference; accuracy on the held-out D_adv turns, on every held-out profiled
-- turn, and on the OOD probe, with 95% bootstrap intervals and paired differences against the reference.
with per_arm as (
    select *,
           row_number() over (partition by coalesce(arm, policy), eval_set order by (seed is null) desc, seed) as pick
    from ablation_results
),
one as (select * from per_arm where pick = 1)
select coalesce(a.arm, a.policy) as arm,
       case when a.seed is null and a.arm is not null then 'pooled' else coalesce(cast(a.seed as varchar), '') end as seeds,
       a.n as n_adv,
       round(a.accuracy, 3) as adv_accuracy,
       printf('[%.3f, %.3f]', a.ci_low, a.ci_high) as adv_ci95,
       round(a.delta, 3) as adv_delta,
       printf('[%+.3f, %+.3f]', a.delta_low, a.delta_high) as adv_delta_ci95,
       round(p.accuracy, 3) as profiled_accuracy,
       round(p.delta, 3) as profiled_delta,
       printf('[%+.3f, %+.3f]', p.delta_low, p.delta_high) as profiled_delta_ci95,
       o.n as n_ood,
       round(o.accuracy, 3) as ood_accuracy,
       round(o.delta, 3) as ood_delta,
       printf('[%+.3f, %+.3f]', o.delta_low, o.delta_high) as ood_delta_ci95,
       a.train_s
from one a
join one p on p.eval_set = 'profiled' and coalesce(p.arm, p.policy) = coalesce(a.arm, a.policy)
join one o on o.eval_set = 'ood' and coalesce(o.arm, o.policy) = coalesce(a.arm, a.policy)
where a.eval_set = 'adv'
order by case coalesce(a.arm, a.policy) when 'base' then 1 when 'reference' then 2 when 'grpo_adv' then 3
         when 'grpo_cand' then 4 when 'grpo_mixed' then 5 when 'grpo_adv_exact' then 6 else 7 end
