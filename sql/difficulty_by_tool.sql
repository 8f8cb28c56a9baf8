-- Difficulty per expert tool (a message action counts as '(message)'; a batch counts once per distinct tool): pass rate, zero-variance share and pivots
with turn_tools as (
    select distinct turn_id,
           unnest(case when tool_names is null or len(tool_names) = 0 then ['(message)'] else tool_names end) as tool_name
    from turns
)
select tt.tool_name,
       count(*) as profiled_turns,
       round(avg(p.reward_mean), 4) as mean_pass_rate,
       round(avg(p.reward_var), 4) as mean_reward_var,
       round(avg((p.reward_var = 0)::int), 4) as zero_variance_share,
       count(*) filter (where p.turn_id in (select turn_id from pivots_mixed)) as mixed_pivots,
       count(*) filter (where p.turn_id in (select turn_id from pivots_adv)) as adv_pivots
from turn_tools tt
join turn_profiles p using (turn_id)
group by tt.tool_name
order by profiled_turns desc, tt.tool_name
