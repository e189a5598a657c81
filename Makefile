# The two commands: `make demo` runs the main job, `make test` passes the tests.
# Each creates .venv if missing, installs the project with its extras, and checks for Java 17 or 21.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench-stores bench-ingest check-java check-chromium check-node install clean

# pip runs through app/dev/pip_install.py: a line per download of 1 MB or more (the rest summed), its progress, the
# time it took, and pip's warnings and errors as they are; not pip's page of "Collecting" lines.
PIP_INSTALL := $(BIN)/python app/dev/pip_install.py

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# Apache Kafka's jars and Spark's Kafka connector come from Maven Central (mvn, checksums checked against
# streaming/kafka/*.lock), cached under ~/.cache/iqgraph: a second install downloads nothing.
$(STAMP): pyproject.toml streaming/kafka/pom.xml streaming/kafka/spark-kafka-pom.xml | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	$(BIN)/python -m iqgraph.streaming.apache_kafka fetch
	touch $(STAMP)

install: $(STAMP)

check-java:
	@ver=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1); \
	if [ "$$ver" != "17" ] && [ "$$ver" != "21" ]; then \
	  echo "Spark 4 needs Java 17 or 21 (found: $${ver:-none})."; \
	  echo "Install it with: apt-get update && apt-get install -y openjdk-17-jre-headless"; \
	  exit 1; \
	fi

# The GraphiQL test loads the page in headless Chromium (Debian's package), installed here when missing.
check-chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Chromium for the GraphiQL browser test (apt-get install chromium)"; \
	    apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; \
	  else \
	    echo "Chromium is missing: the GraphiQL browser test will be skipped (apt-get install chromium)"; \
	  fi; \
	fi

# The tests that run the JavaScript clients users run (tests/js: the GraphQL over HTTP audit, graphql-http) need
# node and npm (Debian's, installed here when missing) and the locked packages (npm ci, again when the lock changes).
JS := tests/js
JS_STAMP := $(JS)/node_modules/.package-lock.json

check-node:
	@if ! command -v npm >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing node and npm for the JavaScript clients' tests (apt-get install nodejs npm)"; \
	    apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null; \
	  else \
	    echo "node and npm are missing: install them (apt-get install nodejs npm) for the JavaScript clients' tests"; \
	    exit 1; \
	  fi; \
	fi

$(JS_STAMP): $(JS)/package.json $(JS)/package-lock.json | check-node
	npm ci --prefix $(JS) --no-audit --no-fund --loglevel=error

demo: install check-java
	$(BIN)/iqgraph demo

test: install check-java check-chromium $(JS_STAMP)
	$(BIN)/python -m pytest -q --durations=12  # the slowest tests: the CI budget is watched

lint: install typecheck
	$(BIN)/ruff check .

# mypy cannot follow setuptools' editable finder (the package-dir mapping of iqgraph.* to the top-level
# folders), so it checks a tree of links laid out as the installed package: build/typecheck/iqgraph/...
TYPECHECK := build/typecheck
typecheck: install
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/iqgraph
	$(BIN)/python -c 'import pathlib, tomllib; \
	  dirs = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]; \
	  tree = pathlib.Path("$(TYPECHECK)"); \
	  [(tree / "iqgraph" / f.name).symlink_to(f.resolve()) for f in pathlib.Path(dirs["iqgraph"]).iterdir() if f.suffix in (".py", ".typed")]; \
	  [(tree / n.replace(".", "/")).symlink_to(pathlib.Path(d).resolve()) for n, d in dirs.items() if n != "iqgraph"]'
	cd $(TYPECHECK) && $(abspath $(BIN))/mypy --config-file $(CURDIR)/pyproject.toml

bench-stores: install
	$(BIN)/python bench/stores.py

bench-ingest: install check-java
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) build *.egg-info $(JS)/node_modules

# GraphQL point lookups beside the raw endpoint, and getMany latency (docs/benchmarks.md). wrk is the load
# client when present; as root it is installed with apt-get, otherwise the bench uses its Python client.
.PHONY: bench-query
bench-query: install check-java
	@if ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q wrk >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } \
	      || echo "bench-query: could not install wrk; using the Python load client"; \
	  else \
	    echo "bench-query: wrk not found (apt-get install wrk); using the Python load client"; \
	  fi; \
	fi
	$(BIN)/python bench/query.py

# One getMany of 1,000 keys over a 3-node cluster beside all-local keys and per-key forwarding (docs/benchmarks.md).
.PHONY: bench-cluster
bench-cluster: install check-java
	$(BIN)/python bench/cluster.py

# One entity query for 1,000 customers beside the same data as separate store fields, on 1 and 3 nodes
# (docs/benchmarks.md). On a shared machine run it under the Spark lock: flock /tmp/iqgraph-spark.lock make bench-entities
.PHONY: bench-entities
bench-entities: install check-java
	$(BIN)/python bench/entities.py

# The sink's cost per record with the ranking index beside the same store without it (in-process), and top-5 per
# genre on 1 and 3 nodes (docs/benchmarks.md; ~2–3 min once the lock is taken). On a shared machine run it under the Spark lock:
# flock /tmp/iqgraph-spark.lock make bench-rankings
.PHONY: bench-rankings
bench-rankings: install check-java
	$(BIN)/python bench/rankings.py

# `make demo` from a fresh clone with empty pip, Maven and jar caches, then warm: the time to its first answer
# (docs/benchmarks.md, "Cold start"). It starts Spark: flock /tmp/iqgraph-spark.lock make bench-cold-start
.PHONY: bench-cold-start
bench-cold-start:
	$(PYTHON) bench/cold_start.py
