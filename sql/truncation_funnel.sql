-- Truncation: profiled turns whose samples ran out of tokens (reason TRUNCATED: a <think> never closed or a tool call
-- cut off; reward 0 like a wrong answer, but not one). hard_only_by_truncation: turns that failed samples only by
-- truncation (no wrong answer), i.e. look hard because of policy.max_new_tokens; raise it, set policy.thinking_budget
-- or thinking: off. Needs only the profiling tables (it binds before curation has run).
with per_turn as (
    select r.turn_id,
           count(*) as k,
           count(*) filter (where r.reason = 'TRUNCATED') as truncated,
           count(*) filter (where r.reward < 1 and r.reason <> 'TRUNCATED') as wrong,
           avg(r.reward) as reward_mean
    from rollout_rewards r
    join turn_profiles p using (turn_id, policy_fp, sampling_fp, verifier_fp)
    where r.sample_index < p.k  -- the profile's samples (a larger budget's share the key)
    group by all
), stages as (
    select 1 as step, 'profiled' as stage, count(*) as n from per_turn
    union all select 2, 'with_truncated_samples', count(*) filter (where truncated > 0) from per_turn
    union all select 3, 'all_samples_truncated', count(*) filter (where truncated = k) from per_turn
    union all select 4, 'hard_only_by_truncation', count(*) filter (where truncated > 0 and wrong = 0) from per_turn
)
select step, stage, n as turns,
       round(n / nullif(max(n) filter (where step = 1) over (), 0), 4) as share_of_profiled
from stages
order by step
