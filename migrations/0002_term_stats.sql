-- BM25 statistics for keyword search, kept by search-svc's write path in the
-- same transaction as the rows they count (see search-svc/src/writes.rs).
-- Counting document frequencies per query over the visible rows cost
-- 60-130 ms at 6K memories and grows with the tenant; these tables make it a
-- handful of index lookups. Kept per (tenant, access level) so a caller's
-- statistics are the sum over the levels it may see: a record above its
-- trust level never influences its ranks, and tenants never mix.
-- Like the old per-query count, they cover every row of the tenant
-- (historical versions included), not only the currently valid ones.

-- Documents containing `lexeme` (a `to_tsvector('english', title || content)`
-- lexeme, as stored in memories.tsv).
CREATE TABLE IF NOT EXISTS term_stats (
    tenant_id    text     NOT NULL,
    lexeme       text     NOT NULL,
    access_level smallint NOT NULL,
    df           bigint   NOT NULL,
    PRIMARY KEY (tenant_id, lexeme, access_level)
);

-- Document count and summed tsv_len (BM25's average document length).
CREATE TABLE IF NOT EXISTS doc_stats (
    tenant_id    text     NOT NULL,
    access_level smallint NOT NULL,
    docs         bigint   NOT NULL,
    total_len    bigint   NOT NULL,
    PRIMARY KEY (tenant_id, access_level)
);

-- Backfill from the rows already there.
INSERT INTO term_stats (tenant_id, lexeme, access_level, df)
SELECT m.tenant_id, u.lexeme, m.access_level, count(*)
FROM memories m, unnest(tsvector_to_array(m.tsv)) AS u(lexeme)
GROUP BY 1, 2, 3
ON CONFLICT DO NOTHING;

INSERT INTO doc_stats (tenant_id, access_level, docs, total_len)
SELECT tenant_id, access_level, count(*), coalesce(sum(tsv_len), 0)
FROM memories
GROUP BY 1, 2
ON CONFLICT DO NOTHING;
