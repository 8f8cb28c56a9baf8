-- How many assistant turns each trajectory has, with its source and domain.
select t.trajectory_id, t.domain, t.source, count(u.turn_id) as n_turns
from trajectories t left join turns u using (trajectory_id)
group by all
order by n_turns desc, t.trajectory_id
