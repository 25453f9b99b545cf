"""Every benchmark and load generator, and the side-by-side benchmark report; the product's code never imports them.

One run, one machine: the ceiling (raw write and read rates of Kafka), then the textbook baseline, then the full
pipeline, each on the same pre-generated traffic: a backlog it starts on, increasing offered rates up to its knee,
and a burst; then `report.md`, `report.json` and the plots. The soak runs the pipeline at one rate for a long time.
`make bench-cluster` runs the pipeline alone on a local Spark standalone cluster of 1, then 2 workers: throughput,
and the CPU per event of the driver and of the executors.

| module | what |
| --- | --- |
| `traffic` | runs simulated before the timed window, pre-serialized with their ground truth; the paced sender |
| `ceiling` | how fast the raw events are written to Kafka and read back (Kafka's own perf tool, a Python consumer) |
| `baseline` | the textbook Spark stream-stream join of the same topics, with a no-op sink |
| `systems` | one system (pipeline or baseline) through a backlog and increasing offered rates, up to its knee |
| `measure` | CPU and memory from /proc, per-thread CPU, the health records in Redis |
| `profile` | flight recordings of the job JVM and where their samples fall |
| `analysis` | the pure arithmetic: rates, percentiles, the knee, flatness, batch cost, targets |
| `report`, `plots` | report.json, report.md and the PNG plots |
| `stream` | `make bench-stream`: one offered rate through the job (one step of `make bench`) |
| `reconcile` | `make bench-reconcile`: reconcile, close and export a synthetic day |
| `realtime` | `make bench-realtime`: whether Spark's real-time mode runs the attribution join, and what it gives |
| `network` | `make bench-network`: the catalog at up to a million ads: its load, doors, pages and cost to the stream |
| `catalog` | `make bench-catalog`: a catalog change to its first bill, and a run whose prices change every minute |
| `web` | `make bench-web`: the dashboard and its API under concurrent clients, on gunicorn |
| `stories` | `make bench-stories`: a month written as the product writes it, then click stories timed |
| `eventlog` | where a benchmark's micro-batches spend their time, from Spark's event log, run by hand |
| `listener` | what a query listener costs the driver per batch, run by hand |
| `wire` | the producers' hot path (serializer, deserializer, simulator), run by hand |
"""
