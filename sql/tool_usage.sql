-- How often each tool is the expert's action, per domain.
select domain, tool_name, count(*) as n_calls, count(distinct trajectory_id) as n_trajectories
from (select domain, trajectory_id, unnest(tool_names) as tool_name from turns)
group by all
order by n_calls desc, tool_name
