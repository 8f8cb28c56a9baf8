-- Pivots per trajectory: turns, profiled turns and pivots in each set for every trajectory (most adv pivots first)
select t.trajectory_id,
       any_value(t.domain) as domain,
       count(*) as turns,
       count(p.turn_id) as profiled_turns,
       count(*) filter (where t.turn_id in (select turn_id from pivots_mixed)) as mixed_pivots,
       count(*) filter (where t.turn_id in (select turn_id from pivots_adv)) as adv_pivots,
       count(*) filter (where t.turn_id in (select turn_id from pivots_cand)) as cand_pivots
from turns t
left join (select distinct turn_id from turn_profiles) p using (turn_id)
group by t.trajectory_id
order by adv_pivots desc, mixed_pivots desc, t.trajectory_id
