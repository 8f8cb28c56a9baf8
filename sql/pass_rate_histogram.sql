-- Reference-policy pass rate (reward_mean) per profiled turn in 10 bins of width 0.1 (1.0 falls in the last bin), with the zero-variance turns of each bin
select least(floor(reward_mean * 10), 9)::int as bin,
       least(floor(reward_mean * 10), 9) / 10 as bin_low,
       least(floor(reward_mean * 10), 9) / 10 + 0.1 as bin_high,
       count(*) as turns,
       round(count(*) / sum(count(*)) over (), 4) as share,
       count(*) filter (where reward_var = 0) as zero_variance_turns
from turn_profiles
group by all
order by bin
