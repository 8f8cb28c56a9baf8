-- Difficulty per domain: turns, profiled turns, pass rate, zero-variance share and pivots in each set
select t.domain,
       count(*) as turns,
       count(p.turn_id) as profiled_turns,
       round(avg(p.reward_mean), 4) as mean_pass_rate,
       round(avg(p.reward_var), 4) as mean_reward_var,
       round(avg((p.reward_var = 0)::int), 4) as zero_variance_share,
       count(*) filter (where t.turn_id in (select turn_id from pivots_mixed)) as mixed_pivots,
       count(*) filter (where t.turn_id in (select turn_id from pivots_adv)) as adv_pivots,
       count(*) filter (where t.turn_id in (select turn_id from pivots_cand)) as cand_pivots
from turns t
left join turn_profiles p using (turn_id)
group by t.domain
order by turns desc, t.domain
