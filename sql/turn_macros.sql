-- Turn-state macros: a turn's state is rebuilt from its trajectory, never stored per turn.
-- Run against a DuckDB database where views `trajectories` (formats.TRAJECTORY_SCHEMA) and
-- `turns` (turn_extraction.TURNS_SCHEMA) exist. The Python twin is turn_extraction.state_for_turn.
--   select turn_state(trajectory_id, message_index) from turns limit 1;
--   select turn_state_of('0123456789abcdef');
--   select * from turn_state_messages('0123456789abcdef');

-- The state messages of the assistant message at 0-based `idx` of trajectory `tid`: messages[:idx].
CREATE OR REPLACE MACRO turn_state(tid, idx) AS (
    SELECT list_slice(t.messages, 1, idx) FROM trajectories t WHERE t.trajectory_id = tid
);

-- The same, looked up by turn_id.
CREATE OR REPLACE MACRO turn_state_of(tid_turn) AS (
    SELECT list_slice(t.messages, 1, u.message_index)
    FROM turns u JOIN trajectories t ON t.trajectory_id = u.trajectory_id
    WHERE u.turn_id = tid_turn
);

-- The tools (JSON text of OpenAI chat tool schemas) that travel with a turn's state.
CREATE OR REPLACE MACRO turn_tools_of(tid_turn) AS (
    SELECT t.tools
    FROM turns u JOIN trajectories t ON t.trajectory_id = u.trajectory_id
    WHERE u.turn_id = tid_turn
);

-- A turn's state as rows: position (0-based) and the message fields.
CREATE OR REPLACE MACRO turn_state_messages(tid_turn) AS TABLE
    SELECT s.position, s.m.role AS role, s.m.content AS content, s.m.reasoning AS reasoning,
           s.m.tool_calls AS tool_calls, s.m.tool_call_id AS tool_call_id
    FROM (
        SELECT unnest(list_slice(t.messages, 1, u.message_index)) AS m,
               generate_subscripts(list_slice(t.messages, 1, u.message_index), 1) - 1 AS position
        FROM turns u JOIN trajectories t ON t.trajectory_id = u.trajectory_id
        WHERE u.turn_id = tid_turn
    ) s
    ORDER BY s.position;
