-- Imported turn profiles (the pass rates pivot rows arrive with: imported_profiles) per model and input file: turns, samples per turn, mean pass rate and reward, the mixed turns and the turns in D_adv; D_adv is selected from them under pivots.profile_source: imported
select model, source, source_fp,
       count(*) as turns,
       min(k) as min_k,
       max(k) as max_k,
       round(avg(n_pass / k), 4) as mean_pass_rate,
       round(avg(reward_mean), 4) as mean_reward,
       count(*) filter (where reward_var > 0) as mixed_turns,
       count(a.turn_id) as adv_pivots
from imported_profiles i
left join (select turn_id, policy_fp from pivots_adv) a using (turn_id, policy_fp)
group by all
order by model, source
