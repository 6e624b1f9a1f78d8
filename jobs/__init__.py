"""pocketmq's Spark jobs (installed as `pocketmq.jobs`; needs the `spark` extra).

    python -m jobs.ingest ...             from the checkout's root
    python -m pocketmq.jobs.ingest ...    installed
    spark-submit jobs/ingest.py ...       as a script

`ingest` streams topics into a Parquet dataset partitioned by day, exactly once across
crashes; `replay` writes such a dataset back into a topic. Both are thin drivers over the
`pocketmq` Spark source (pocketmq.spark); nothing of pocketmq imports this package.

This file stays empty of imports: from the checkout, `python -m jobs.ingest` imports it as
the top-level package `jobs`, and the job modules import their siblings as
`pocketmq.jobs.*` (a script run by spark-submit has no package to be relative to).
"""
