-- kirim schema version 18 (PostgreSQL): leaner job and attempt writes (issue 24). Same
-- tables, names and checks as SQLite.
--
-- upgrade: safe: it drops a foreign key and an index no statement reads and gives two
--   tables room on their pages; older workers write and read the same rows as before
--
-- What a delivery's claim, intent and finish wrote to the WAL, measured by
-- bench/wal_breakdown.py (docs/benchmarks.md): every update of a job is a new version
-- with new index entries (its status is named by the queue's partial indexes: never
-- HOT), and two more records came with it:
--
-- - kirim_attempts.job_id referenced kirim_jobs: each intent's insert locked its job
--   (FOR KEY SHARE, a WAL record) to check the key, and retention's delete of a job
--   looked for attempts naming it (kirim_attempts_job, an index entry per attempt that
--   nothing else reads). An attempt is only ever inserted by the intent's statement,
--   with the job of the claim its token fences (the job's lease token is the
--   delivery's claim token), and retention deletes a delivery's attempts before its
--   jobs, in one transaction: the key and its index go, as the key to the deliveries
--   went in 0013 (the explorer's jobs_of_attempts checks what the key did).
-- - a job's page was full (fillfactor 100): each update's new version went to another
--   page, which PostgreSQL logs as a lock of the old version first, and then the whole
--   new tuple (on the same page it logs only the bytes that changed). Jobs and
--   attempts now keep room on each page for the versions a claim and a finish write
--   (fillfactor 40; the attempts had 50, where one finish in ten did not fit and was
--   not HOT). This applies to pages written from now on; no table is rewritten.
--
-- On a populated database every statement is a catalog change: it takes the two
-- tables' exclusive locks (attempts, then jobs) from there to the commit, a few
-- milliseconds (docs/upgrading.md has the figures of a million deliveries).
ALTER TABLE kirim_attempts DROP CONSTRAINT kirim_attempts_job_id_fkey;
DROP INDEX kirim_attempts_job;
ALTER TABLE kirim_jobs SET (fillfactor = 40);
ALTER TABLE kirim_attempts SET (fillfactor = 40);
