-- Difficulty by turn depth (turn_index = 0 for a trajectory's first assistant turn; 20 and deeper are pooled as depth 20): pass rate and pivots
select least(t.turn_index, 20) as depth,
       count(*) as turns,
       count(p.turn_id) as profiled_turns,
       round(avg(t.message_index), 1) as mean_message_index,
       round(avg(p.reward_mean), 4) as mean_pass_rate,
       round(avg((p.reward_var = 0)::int), 4) as zero_variance_share,
       count(*) filter (where t.turn_id in (select turn_id from pivots_mixed)) as mixed_pivots,
       count(*) filter (where t.turn_id in (select turn_id from pivots_adv)) as adv_pivots
from turns t
left join turn_profiles p using (turn_id)
group by all
order by depth
