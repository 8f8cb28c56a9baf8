-- Refresh rounds: the turns whose bucket (adv, mixed, easy, unsolved) changed from round r-1 to round r, with their pass rates; skipped: the turn was not profiled again in round r (its profile was carried forward, so its bucket cannot change)
select cur.round, cur.turn_id, prev.bucket as from_bucket, cur.bucket as to_bucket,
       prev.reward_mean as pass_rate_before, cur.reward_mean as pass_rate, cur.k, cur.trained
from refresh_profiles cur
join refresh_profiles prev on prev.turn_id = cur.turn_id and prev.round = cur.round - 1
where prev.bucket <> cur.bucket
order by cur.round, from_bucket, to_bucket, cur.turn_id
