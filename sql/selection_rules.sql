-- D_adv under each selection rule (pivots.rule: pivotrl | band | variance_top_p | std_min) with the parameters in force or their defaults, caps included, over the current turn_profiles: set size, overlap with the pivotrl set, mean reward and mean variance; in_force marks the rule the pivot sets use (the rules are computed by curation/selection.py when the sets are selected)
select rule, parameters, in_force, pivots, overlap_with_pivotrl,
       round(overlap_with_pivotrl / nullif(pivots, 0), 4) as overlap_share,
       round(mean_reward, 4) as mean_reward, round(mean_variance, 4) as mean_variance
from selection_rule_comparison
order by case rule when 'pivotrl' then 1 when 'band' then 2 when 'variance_top_p' then 3 else 4 end
