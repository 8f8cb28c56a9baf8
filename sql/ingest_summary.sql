-- Trajectories and turns per source format and domain.
select t.source_format, t.domain, count(distinct t.trajectory_id) as n_trajectories, count(u.turn_id) as n_turns,
       round(avg(t.outcome_reward), 3) as mean_outcome_reward
from trajectories t left join turns u using (trajectory_id)
group by all
order by n_turns desc
