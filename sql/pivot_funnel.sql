-- The pivot funnel: how many turns survive each stage (turns -> profiled -> mixed -> adv; cand = the no-filter ablation), and their share of all turns; prompt_too_long: turns not profiled because their prompt does not fit the model's context (skipped_turns)
with stages as (
    select 1 as step, 'turns' as stage, (select count(*) from turns) as n
    union all select 2, 'prompt_too_long', (select count(*) from skipped_turns)
    union all select 3, 'profiled', (select count(distinct turn_id) from turn_profiles)
    union all select 4, 'mixed', (select count(*) from pivots_mixed)
    union all select 5, 'adv', (select count(*) from pivots_adv)
    union all select 6, 'cand', (select count(*) from pivots_cand)
)
select step, stage, n as turns,
       round(n / nullif(max(n) filter (where step = 1) over (), 0), 4) as share_of_turns
from stages
order by step
