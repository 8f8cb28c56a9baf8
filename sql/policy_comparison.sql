-- Reference vs same-data SFT vs GRPO: local accuracy on held-out pivots and the out-of-domain probe.
select policy, n_pivots, k, round(local_accuracy, 3) as local_accuracy, round(ood_accuracy, 3) as ood_accuracy
from pivot_eval
order by case policy when 'reference' then 1 when 'sft' then 2 when 'grpo' then 3 else 4 end
