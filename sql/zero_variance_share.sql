-- Share of profiled turns with zero reward variance (no learning signal for GRPO): all pass, all fail, or all samples equal in between; per domain and overall ('(all)')
select coalesce(domain, '(all)') as domain,
       count(*) as profiled_turns,
       count(*) filter (where reward_var = 0) as zero_variance,
       count(*) filter (where reward_var = 0 and reward_mean = 1) as all_pass,
       count(*) filter (where reward_var = 0 and reward_mean = 0) as all_fail,
       count(*) filter (where reward_var = 0 and reward_mean > 0 and reward_mean < 1) as all_equal_partial,
       round(count(*) filter (where reward_var = 0) / count(*), 4) as zero_variance_share
from turn_profiles
group by grouping sets ((domain), ())
order by grouping(domain), profiled_turns desc, domain
