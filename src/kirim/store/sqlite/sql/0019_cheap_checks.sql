-- kirim schema version 19 (SQLite): status checks a row's write pays nothing for.
-- Same tables, names and checks as PostgreSQL; only the spelling of the checks changes.
--
-- upgrade: safe: every row and column stays; each check and the index of the active
--   jobs accept exactly the values they accepted; older workers write the same rows
--
-- SQLite evaluates `x IN ('a', 'b', 'c')` (a list of three constants or more) by
-- building a temporary B-tree of the list, once per run of a statement: a statement
-- run once per row (executemany: the finish, the intent, the enqueue) built it for
-- every row, for every CHECK that names a column the statement writes and for the
-- predicate of every partial index over a column it changes (the old row's and the
-- new one's). bench/check_lists.py measures it: 2 to 3.5 us per list and row, about
-- 20 us of a delivery's claim, intent and finish. A list of two constants or fewer,
-- and a chain of `=` joined by OR, are plain comparisons. So:
--
-- - every CHECK naming such a list says the same as a chain of `=` joined by OR (for
--   a NULL it is NULL, as the list's test is: a CHECK passes either). SQLite cannot
--   alter a CHECK: the schema's text is edited, as in versions 5 and 7 (the way
--   SQLite's ALTER TABLE documentation gives for a change that leaves every stored
--   row valid), and the migration runner bumps the schema cookie and checks the file;
-- - the index of the active jobs (one per delivery) names the two statuses a job
--   that is no longer active has, instead of the three of one that is. Rebuilt: it
--   reads the jobs once (on a million, about a second, under the migration's write
--   lock; docs/upgrading.md).
--
-- tests/contract/test_migrate_checks.py keeps SQLite's schema free of such lists.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql, 'status IN
        (''pending'', ''processing'', ''sent'', ''confirmed'', ''failed'', ''canceled'', ''in_doubt'', ''delivered'', ''bounced'', ''suppressed'')',
    'status = ''pending'' OR status = ''processing'' OR status = ''sent'' OR status = ''confirmed'' OR status = ''failed'' OR status = ''canceled'' OR status = ''in_doubt'' OR status = ''delivered'' OR status = ''bounced'' OR status = ''suppressed''')
WHERE type = 'table' AND name = 'kirim_deliveries';
UPDATE sqlite_master
SET sql = replace(sql, 'doubt IN (''assumed_sent'', ''held'', ''resolved'')',
    'doubt = ''assumed_sent'' OR doubt = ''held'' OR doubt = ''resolved''')
WHERE type = 'table' AND name = 'kirim_deliveries';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN
        (''queued'', ''running'', ''retry_scheduled'', ''completed'', ''dead'')',
    'status = ''queued'' OR status = ''running'' OR status = ''retry_scheduled'' OR status = ''completed'' OR status = ''dead''')
WHERE type = 'table' AND name = 'kirim_jobs';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN
        (''requested'', ''succeeded'', ''failed_permanent'', ''failed_transient'', ''unknown'')',
    'status = ''requested'' OR status = ''succeeded'' OR status = ''failed_permanent'' OR status = ''failed_transient'' OR status = ''unknown''')
WHERE type = 'table' AND name = 'kirim_attempts';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN (''sent'', ''failed'', ''canceled'', ''delivered'', ''bounced'', ''suppressed'')',
    'status = ''sent'' OR status = ''failed'' OR status = ''canceled'' OR status = ''delivered'' OR status = ''bounced'' OR status = ''suppressed''')
WHERE type = 'table' AND name = 'kirim_key_tombstones';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN (''delivered'', ''bounced'', ''failed'')',
    'status = ''delivered'' OR status = ''bounced'' OR status = ''failed''')
WHERE type = 'table' AND name = 'kirim_confirmations';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN (''delivered'', ''bounced'', ''failed'')',
    'status = ''delivered'' OR status = ''bounced'' OR status = ''failed''')
WHERE type = 'table' AND name = 'kirim_callback_inbox';
UPDATE sqlite_master
SET sql = replace(sql, 'status IN (''waiting'', ''done'', ''canceled'')',
    'status = ''waiting'' OR status = ''done'' OR status = ''canceled''')
WHERE type = 'table' AND name = 'kirim_runs';
UPDATE sqlite_master
SET sql = replace(sql, 'outcome IN (''sent'', ''waited'', ''then'', ''else'', ''skipped'',
                                                 ''gathered'', ''joined'')',
    'outcome = ''sent'' OR outcome = ''waited'' OR outcome = ''then'' OR outcome = ''else'' OR outcome = ''skipped'' OR outcome = ''gathered'' OR outcome = ''joined''')
WHERE type = 'table' AND name = 'kirim_run_steps';
PRAGMA writable_schema = OFF;

DROP INDEX kirim_jobs_one_active;
CREATE UNIQUE INDEX kirim_jobs_one_active ON kirim_jobs (delivery_id)
    WHERE status NOT IN ('completed', 'dead');
