-- The mix of action kinds (tool_call / message / tool_call_batch) per domain.
select domain, action_kind, count(*) as n_turns,
       round(100.0 * count(*) / sum(count(*)) over (partition by domain), 1) as pct
from turns
group by domain, action_kind
order by domain, n_turns desc
