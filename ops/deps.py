"""Everything the product needs that pip does not install: Kafka's jars, Spark's connectors, redis-server,
PostgreSQL's server.

Each `ensure_*` is idempotent and quick once done: jars are fetched from Maven Central with Maven into
`.deps/` (git-ignored) and marked complete only after Maven succeeded, so an interrupted fetch is redone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MAVEN_DIR = Path(__file__).resolve().parent / "maven"
KAFKA_POM = MAVEN_DIR / "kafka-broker.xml"
SPARK_POM = MAVEN_DIR / "spark-connectors.xml"
_COMPLETE = ".complete"


class DependencyError(RuntimeError):
    """A dependency could not be had; the message names the command that failed and its output."""


def pom_property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if not match:
        raise DependencyError(f"{pom} has no <{name}> property")
    return match.group(1).strip()


def kafka_version() -> str:
    return pom_property(KAFKA_POM, "kafka.version")


def spark_version() -> str:
    """The installed pyspark's version: the connectors must match it exactly."""
    import pyspark

    return pyspark.__version__


def ensure_kafka_jars(deps_dir: Path) -> Path:
    """The folder with Kafka's broker and tools jars, fetched on first use."""
    target = deps_dir.resolve() / f"kafka-{kafka_version()}"
    _copy_dependencies(KAFKA_POM, target, {})
    return target


def ensure_spark_connector_jars(deps_dir: Path) -> list[Path]:
    """spark-sql-kafka-0-10 and spark-avro jars of the installed pyspark's version, minus what pyspark ships."""
    version = spark_version()
    target = deps_dir.resolve() / f"spark-connectors-{version}"
    _copy_dependencies(SPARK_POM, target, {"spark.version": version})
    return jars_pyspark_lacks(target)


def jars_pyspark_lacks(folder: Path) -> list[Path]:
    """The jars of `folder` whose artifact the installed pyspark does not ship (of any version)."""
    shipped = {_artifact_name(jar.name) for jar in _pyspark_jars_dir().glob("*.jar")}
    return sorted(jar for jar in folder.glob("*.jar") if _artifact_name(jar.name) not in shipped)


def kafka_classpath(deps_dir: Path) -> str:
    return os.pathsep.join(str(jar) for jar in sorted(ensure_kafka_jars(deps_dir).glob("*.jar")))


def ensure_redis_server() -> str:
    """Path of redis-server, installing Debian's package when it is missing and we may."""
    return ensure_debian_tool("redis-server", "redis-server", "the live totals")


POSTGRES_ROOT = Path("/usr/lib/postgresql")


def ensure_postgres() -> Path:
    """The folder of PostgreSQL's server programs (`initdb`, `postgres`) of the newest version Debian installed,
    installing Debian's `postgresql` package when none is and we may."""
    found = _postgres_bin()
    if found is None:
        apt_install(["postgresql"], "PostgreSQL's server")
        found = _postgres_bin()
    if found is None:
        raise DependencyError(f"apt-get installed postgresql but {POSTGRES_ROOT}/*/bin/postgres is missing")
    return found


def _postgres_bin() -> Path | None:
    versions = [p for p in POSTGRES_ROOT.glob("*/bin") if (p / "postgres").exists() and (p / "initdb").exists()]
    return max(versions, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, default=None)


CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def ensure_browser() -> tuple[Path, Path]:
    """Debian's `chromium` and `chromium-driver` (for the browser tests), installed with apt when missing and we may.

    Returns (browser, driver). The tests point Selenium at this driver: no browser is ever downloaded.
    """
    wanted = {"chromium": CHROMIUM, "chromium-driver": CHROMEDRIVER}
    missing = [package for package, path in wanted.items() if not path.exists()]
    if missing:
        # Fonts so that screenshots show text; recommends left out to keep the install small.
        apt_install(missing, "the browser tests", also=["fonts-dejavu-core"])
        still = [package for package, path in wanted.items() if not path.exists()]
        if still:
            raise DependencyError(f"apt-get installed {', '.join(still)} but {CHROMIUM} or {CHROMEDRIVER} is missing")
    return CHROMIUM, CHROMEDRIVER


def ensure_debian_tool(binary: str, package: str, why: str) -> str:
    """Path of `binary`, installing Debian's `package` with apt when it is missing and we may (root)."""
    found = shutil.which(binary)
    if found:
        return found
    apt_install([package], f"{binary} ({why})")
    found = shutil.which(binary)
    if not found:
        raise DependencyError(f"apt-get installed {package} but {binary} is not on PATH")
    return found


def apt_install(packages: list[str], what: str, also: list[str] | None = None) -> None:
    """Install Debian's `packages` (and `also`), without their recommends; DependencyError saying the command to run
    when we may not (not root)."""
    if os.geteuid() != 0:
        raise DependencyError(
            f"{what}: not installed; install Debian's package with: "
            f"sudo apt-get update && sudo apt-get install -y {' '.join(packages)}"
        )
    print(f"installing Debian's {', '.join(packages)} ({what}) ...", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-qq"], env=env)
    _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, *(also or [])], env=env)


def ensure_promtool() -> str:
    """Prometheus's `promtool` (Debian's `prometheus` package), which tests the alert rules of `ops/alerts/`."""
    return ensure_debian_tool("promtool", "prometheus", "tests the alert rules")


def ensure_pdftoppm() -> str:
    """Poppler's `pdftoppm` (Debian's `poppler-utils`), which renders the monthly statement's PDF for its test."""
    return ensure_debian_tool("pdftoppm", "poppler-utils", "renders statement PDFs in the tests")


def ensure_graphviz() -> str:
    """Graphviz's `dot` (Debian's `graphviz`), which draws the data-flow picture of the docs from its source."""
    return ensure_debian_tool("dot", "graphviz", "draws the docs' data-flow picture")


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise DependencyError("java is not on PATH: install a JDK 17 (Debian: openjdk-17-jdk-headless)")
    return found


def ensure_all(deps_dir: Path, redis: bool = True, browser: bool = True) -> None:
    """Fetch or check every external dependency, printing one line for each."""
    print(f"kafka jars: {ensure_kafka_jars(deps_dir)}")
    jars = ensure_spark_connector_jars(deps_dir)
    print(f"spark connectors ({spark_version()}): {', '.join(jar.name for jar in jars)}")
    if redis:
        print(f"redis-server: {ensure_redis_server()}")
        print(f"postgresql: {ensure_postgres()}")
    if browser:
        print("chromium, chromedriver (browser tests): {}, {}".format(*ensure_browser()))
        print(f"promtool (alert rule tests): {ensure_promtool()}")
        print(f"pdftoppm (statement PDF tests): {ensure_pdftoppm()}")
        print(f"dot (the docs' data-flow picture): {ensure_graphviz()}")
    print(f"java: {java_binary()}")


def _copy_dependencies(pom: Path, target: Path, properties: dict[str, str]) -> None:
    """`pom`'s runtime dependencies in `target`, fetched once; again, into an emptied `target`, when the pom or the
    properties changed since (its `_COMPLETE` marker records what it was fetched for)."""
    fetched_for = f"{hashlib.sha256(pom.read_bytes()).hexdigest()} {sorted(properties.items())}"
    marker = target / _COMPLETE
    if marker.exists():
        if marker.read_text().splitlines()[-1:] == [fetched_for]:
            return
        shutil.rmtree(target)
    mvn = shutil.which("mvn")
    if not mvn:
        raise DependencyError("Maven (mvn) is not on PATH: install Debian's maven package")
    target.mkdir(parents=True, exist_ok=True)
    print(f"fetching {pom.stem} jars from Maven Central into {target} ...", file=sys.stderr, flush=True)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={target}",
        "-DincludeScope=runtime",
        *(f"-D{key}={value}" for key, value in properties.items()),
    ]
    _run(command)
    marker.write_text(" ".join(command) + "\n" + fetched_for + "\n")


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-4000:]
        raise DependencyError(f"`{' '.join(command)}` failed with exit code {result.returncode}:\n{output}")


def _pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _artifact_name(jar_name: str) -> str:
    """`kafka-clients-3.9.0.jar` -> `kafka-clients`: the name without version."""
    match = re.match(r"^(.+)-\d+(?:\.\d+)+(?:[-.]\w+)*\.jar$", jar_name)
    return match.group(1) if match else jar_name
