-- Turns the profiler left out and why (prompt_too_long: the rendered prompt has more tokens than policy.max_prompt_tokens, by default the model's context minus max_new_tokens)
select s.reason, s.turn_id, u.domain, u.message_index, s.n_prompt_tokens, s.max_prompt_tokens
from skipped_turns s
join turns u using (turn_id)
order by s.reason, s.n_prompt_tokens desc, s.turn_id
