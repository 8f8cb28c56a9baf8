-- Rollout budget of the refresh rounds (refresh_budget: one row per round and phase), one row per round and a 'total' row: samples (one generated assistant turn each) and generated tokens spent on profiling, on GRPO generation and on evaluation.
-- Beside them, end-to-end RL on the same trajectories at the same GRPO budget:
--   local_samples  = profiling_samples + grpo_samples (evaluation is left out of both sides: either would evaluate alike)
--   e2e_samples    = grpo_steps x prompts_per_step x num_generations x turns_per_trajectory
--                    (end-to-end RL rolls each group member out over its whole trajectory: every assistant turn is
--                    generated; turns_per_trajectory = the mean assistant turns of the trajectories in the pool)
--   e2e_tokens     = e2e_samples x the mean generated tokens of a GRPO sample
--   e2e_over_local = e2e_samples / local_samples (the paper reports about 4x fewer rollout turns than end-to-end RL)
with phases as (
    select round::varchar as round, round as round_order,
           (sum(samples) filter (where phase = 'profiling'))::bigint as profiling_samples,
           (sum(generated_tokens) filter (where phase = 'profiling'))::bigint as profiling_tokens,
           (sum(samples) filter (where phase = 'grpo_generation'))::bigint as grpo_samples,
           (sum(generated_tokens) filter (where phase = 'grpo_generation'))::bigint as grpo_tokens,
           (sum(samples) filter (where phase = 'evaluation'))::bigint as eval_samples,
           (sum(generated_tokens) filter (where phase = 'evaluation'))::bigint as eval_tokens,
           (sum(grpo_steps * prompts_per_step * num_generations) filter (where phase = 'grpo_generation'))::bigint as e2e_groups,
           (sum(grpo_steps) filter (where phase = 'grpo_generation'))::bigint as grpo_steps
    from refresh_budget
    group by round
),
rows as (
    select * from phases
    union all
    select 'total', 1e9, sum(profiling_samples)::bigint, sum(profiling_tokens)::bigint, sum(grpo_samples)::bigint,
           sum(grpo_tokens)::bigint, sum(eval_samples)::bigint, sum(eval_tokens)::bigint, sum(e2e_groups)::bigint,
           sum(grpo_steps)::bigint
    from phases
),
pool as (
    select count(*)::double / count(distinct trajectory_id) as turns_per_trajectory
    from turns
    where trajectory_id in (select trajectory_id from refresh_profiles where round = 0)
)
select round, grpo_steps, profiling_samples, profiling_tokens, grpo_samples, grpo_tokens, eval_samples, eval_tokens,
       profiling_samples + grpo_samples + eval_samples as total_samples,
       profiling_tokens + grpo_tokens + eval_tokens as total_tokens,
       profiling_samples + grpo_samples as local_samples,
       round(pool.turns_per_trajectory, 3) as turns_per_trajectory,
       round(e2e_groups * pool.turns_per_trajectory) as e2e_samples,
       round(e2e_groups * pool.turns_per_trajectory * grpo_tokens / nullif(grpo_samples, 0)) as e2e_tokens,
       round(e2e_groups * pool.turns_per_trajectory / nullif(profiling_samples + grpo_samples, 0), 3) as e2e_over_local
from rows, pool
order by round_order
