-- Trajectories and turns per source format and domain, with the mean outcome reward per trajectory.
select t.source_format, t.domain, count(*) as n_trajectories, sum(coalesce(u.n_turns, 0))::bigint as n_turns,
       round(avg(t.outcome_reward), 3) as mean_outcome_reward
from trajectories t
left join (select trajectory_id, count(*) as n_turns from turns group by all) u using (trajectory_id)
group by all
order by n_turns desc
