# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench serve clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The env-server extra is all the demo needs (no torch, no test tools).
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[envserver]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed-run

demo: $(VENV)/.installed-run
	$(BIN)/awm demo

serve: $(VENV)/.installed-run
	$(BIN)/awm serve

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q --durations=30

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.runtime --json

clean:
	rm -rf $(VENV) .pytest_cache
