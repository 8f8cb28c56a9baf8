-- Refresh rounds: turns per (round, bucket in the round before, bucket now), unchanged ones included (the data of the bucket-flow plot); skipped counts the turns carried forward without profiling
select cur.round, prev.bucket as from_bucket, cur.bucket as to_bucket, count(*) as turns,
       count(*) filter (where cur.skipped) as skipped, count(*) filter (where cur.replayed) as replayed
from refresh_profiles cur
join refresh_profiles prev on prev.turn_id = cur.turn_id and prev.round = cur.round - 1
group by all
order by cur.round, from_bucket, to_bucket
