-- Edges engram itself detected (search-svc/src/updates.rs: a new memory
-- that updates an older one) are told apart from the callers' own: origin
-- 'detected' with the detector's reason; every other edge is 'caller'.
ALTER TABLE edges ADD COLUMN IF NOT EXISTS origin text NOT NULL DEFAULT 'caller';
ALTER TABLE edges ADD COLUMN IF NOT EXISTS reason text;
