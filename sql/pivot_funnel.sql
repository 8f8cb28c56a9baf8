-- The pivot funnel: how many turns survive each stage (turns -> profiled -> mixed -> adv; cand = the no-filter ablation), and their share of all turns
with stages as (
    select 1 as step, 'turns' as stage, (select count(*) from turns) as n
    union all select 2, 'profiled', (select count(distinct turn_id) from turn_profiles)
    union all select 3, 'mixed', (select count(*) from pivots_mixed)
    union all select 4, 'adv', (select count(*) from pivots_adv)
    union all select 5, 'cand', (select count(*) from pivots_cand)
)
select step, stage, n as turns,
       round(n / nullif(max(n) filter (where step = 1) over (), 0), 4) as share_of_turns
from stages
order by step
