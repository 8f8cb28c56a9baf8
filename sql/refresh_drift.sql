-- Refresh rounds: pass-rate drift from round r-1 to round r over the turns profiled again in round r (skipped ones carry their old profile), per bucket of round r-1 and over all ('(all)'): mean pass rate before and after, and the mean change
select cur.round, coalesce(prev.bucket, '(all)') as from_bucket, count(*) as turns,
       round(avg(prev.reward_mean), 4) as pass_rate_before, round(avg(cur.reward_mean), 4) as pass_rate,
       round(avg(cur.reward_mean - prev.reward_mean), 4) as drift
from refresh_profiles cur
join refresh_profiles prev on prev.turn_id = cur.turn_id and prev.round = cur.round - 1
where not cur.skipped
group by grouping sets ((cur.round, prev.bucket), (cur.round))
order by cur.round, grouping(prev.bucket), from_bucket
