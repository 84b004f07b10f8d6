-- Conversation turns as first-class memories (issue 20): the session a turn
-- belongs to, its place in it, who said it and an attachment's caption.
-- `context` is what search-svc adds to the turn's keyword index from its
-- session (the date and the turns before it, only those at the same or a
-- lower access level: search-svc/src/turns.rs); results still point at the
-- turn itself.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS session_id text;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS turn_index integer;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS speaker text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS caption text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS context text NOT NULL DEFAULT '';

-- The keyword index now also holds the speaker, the caption (body weight)
-- and the session context (weight C). For rows written before, all three
-- are empty, so their lexemes and the BM25 statistics stay as they were.
ALTER TABLE memories DROP COLUMN IF EXISTS tsv;
ALTER TABLE memories ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, speaker || ' ' || content || ' ' || caption), 'B') ||
    setweight(to_tsvector('english'::regconfig, context), 'C')) STORED;
CREATE INDEX IF NOT EXISTS memories_tsv_gin ON memories USING gin (tsv);

-- A new turn looks up the turns before it in its session.
CREATE INDEX IF NOT EXISTS memories_session_turn
    ON memories (tenant_id, session_id, turn_index) WHERE session_id IS NOT NULL;
