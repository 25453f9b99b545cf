"""The job's query listeners' common base: each batch's progress as Spark's own JSON, one call into the JVM.

pyspark hands a listener's `onQueryProgress` a `StreamingQueryProgress` built from the Java object field by field:
dozens of Py4J calls per listener per batch and its observed metrics' rows unpickled: about 450 ms per event and
listener, against 3.5 ms for one `progress().json()` (`python -m ops.bench.listener`). The job has three listeners and
needs none of those objects: the health record is built from the progress JSON, the heartbeat from the query's id, and
the job's lock reads no progress at all. A `ProgressListener` gets `on_progress(dict)` from Spark's
`progress().json()`, or nothing when it does not read progress (`reads_progress = False`).

This goes through pyspark's listener wrapper (`StreamingQueryListener._jlistener`, the Java interface
`PythonStreamingQueryListener`), which the pinned pyspark has; the test of the job's health records runs it on
real Spark.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener


class ProgressListener(StreamingQueryListener):
    """A query listener that reads each batch's progress as a dict of Spark's progress JSON (module doc)."""

    reads_progress = True
    """False: Spark's progress events are not read at all (nothing is converted)."""

    def on_progress(self, progress: dict[str, Any]) -> None:
        """One batch's progress, as Spark's `StreamingQueryProgress.json`."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        # pyspark's own path (a listener called with pyspark's event object): the same dict.
        if self.reads_progress:
            self.on_progress(json.loads(event.progress.json))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if not hasattr(self, "_lean_jlistener"):
            jvm = SparkContext._jvm
            assert jvm is not None, "a listener is added to a running Spark session"
            self._lean_jlistener = jvm.PythonStreamingQueryListenerWrapper(self._java_events())
        return self._lean_jlistener

    def _java_events(self) -> JStreamingQueryListener:
        """What the JVM calls for this listener."""
        return _JsonProgress(self)


class _JsonProgress(JStreamingQueryListener):
    """What the JVM calls: pyspark's, except that a progress event becomes one `json()` call or none."""

    pylistener: ProgressListener

    def onQueryProgress(self, jevent: Any) -> None:
        if self.pylistener.reads_progress:
            self.pylistener.on_progress(json.loads(jevent.progress().json()))
