# The front door. Every target is a thin call of `python -m repro`, which does the work and
# prints what it is about to do; variables below are passed through when set.
#   make repro                    CPU twin of the reporter's stack (the default env), all scenarios
#   make repro ENV=rocm56         the reporter's stack in a ROCm 5.6 container (AMD host)
#   make test                     every test tier this host can run
# Only Python 3.9-3.11 is needed: the first run sets up the host side in a project-local venv,
# .venv/ (made with BOOTSTRAP_PYTHON, default python3, and `pip install -e .[dev]`), reused while
# pyproject.toml is unchanged. PYTHON=/path/to/python uses that interpreter as it is instead.

# The variables this Makefile reads from the user (tests/project/test_control_characters.py keeps the
# list complete). None may hold a newline or other control character: a newline in a value splits
# the recipe line it is pasted into, and the second line runs as a command (`make list
# MATRIX=$'x\ntouch /tmp/p #'`). Checked before anything else, on the raw text ($(value) expands
# nothing), and only these: the environment itself legitimately holds multi-line variables.
USER_VARIABLES := ALLOW_PRIVILEGES AUTHOR_EMAIL AUTHOR_NAME AXIS BAD BAD_IF BOOTSTRAP_PYTHON BRANCH BUNDLE CMD COMMITS CONFIG \
	DEEPSPEED DEEPSPEED_COMMIT DEEPSPEED_SRC DEVICES DRY_RUN DS_REPO DTYPE ENGINE ENV EVERY FORCE FROM \
	GOOD GZIP_LEVEL IMAGE JOBS KEEP LAUNCHER LAYOUT LOSS_REGEX MATRIX NETWORK NO_HANG NO_SYNC_PROOF OUT PACKAGES \
	PARALLEL PATCH PR PRERELEASES PYTEST_ARGS PYTHON PYTHON_VENV QUIET RANGE RANGE_TORCH REF REFERENCE REFRESH_VERSIONS \
	RELEASES REQUIREMENTS RESULTS RESUME REUSE_IMAGE RUNNER SCENARIO SCENARIOS SLURM_GPUS_PER_TASK SLURM_PARTITION \
	SLURM_TIME STALL_TIMEOUT STEPS TIMEOUT TO TORCH TORCHES TRANSPORT VERBOSE VERIFY VERSIONS WORKDIR WORLD_SIZE
define _newline


endef
# Make splits words at tab, VT, FF and CR too, so those four (and newline) are looked for one by
# one; the other C0 controls, DEL and the C1 controls (UTF-8) are a word list.
_tab := $(shell printf '\011')
_vt := $(shell printf '\013')
_ff := $(shell printf '\014')
_cr := $(shell printf '\015')
_controls := $(shell printf '\001 \002 \003 \004 \005 \006 \007 \010 \016 \017 \020 \021 \022 \023 \024 \025 \026 \027 \030 \031 \032 \033 \034 \035 \036 \037 \177 \302\200 \302\201 \302\202 \302\203 \302\204 \302\205 \302\206 \302\207 \302\210 \302\211 \302\212 \302\213 \302\214 \302\215 \302\216 \302\217 \302\220 \302\221 \302\222 \302\223 \302\224 \302\225 \302\226 \302\227 \302\230 \302\231 \302\232 \302\233 \302\234 \302\235 \302\236 \302\237')
_has = $(if $(findstring $(1),$(value $(2))),x)
_control_in = $(strip $(call _has,$(_newline),$(1)) $(call _has,$(_tab),$(1)) $(call _has,$(_vt),$(1)) \
	$(call _has,$(_ff),$(1)) $(call _has,$(_cr),$(1)) $(foreach c,$(_controls),$(call _has,$(c),$(1))))
$(foreach v,$(USER_VARIABLES),$(if $(filter command line environment,$(origin $(v))),$(if \
	$(call _control_in,$(v)),$(error $(v)= holds a newline or another control character; values are \
	one line of text: give $(v) without it (several commands: put them in a script and run that)))))

# Switches are yes/no, read as strictly as the tool reads RESUME= (repro/core/flags.py): 1, true,
# yes, on (any case) are yes; 0, false, no, off or empty are no. Any other value given on the
# command line stops make before any recipe runs; from the environment (where a shell may hold,
# say, NETWORK= for another program) it is a no, with a warning. (Any text used to be yes:
# `make repro DRY_RUN=0` started a dry run.) tests/project/test_makefile_switches.py keeps this list complete.
SWITCHES := ALLOW_PRIVILEGES COMMITS DRY_RUN EVERY FORCE KEEP NETWORK NO_HANG NO_SYNC_PROOF PRERELEASES \
	QUIET RANGE REFRESH_VERSIONS REUSE_IMAGE VERBOSE VERIFY
_lower = $(subst Z,z,$(subst Y,y,$(subst X,x,$(subst W,w,$(subst V,v,$(subst U,u,$(subst T,t,$(subst S,s,$(subst R,r,$(subst Q,q,$(subst P,p,$(subst O,o,$(subst N,n,$(subst M,m,$(subst L,l,$(subst K,k,$(subst J,j,$(subst I,i,$(subst H,h,$(subst G,g,$(subst F,f,$(subst E,e,$(subst D,d,$(subst C,c,$(subst B,b,$(subst A,a,$(1)))))))))))))))))))))))))))
_switch = $(call _lower,$(strip $(value $(1))))
_not_yes_no = $(strip $(filter-out 1 true yes on 0 false no off,$(call _switch,$(1))) $(word 2,$(call _switch,$(1))))
yes = $(if $(call _not_yes_no,$(1)),,$(filter 1 true yes on,$(call _switch,$(1))))
$(foreach v,$(SWITCHES),$(if $(call _not_yes_no,$(v)),$(if $(filter environment,$(origin $(v))),$(warning \
	$(v) in the environment is neither yes nor no: taken as no for this make), $(error $(v)= is neither \
	yes nor no: $(v) takes 1/true/yes/on for yes, 0/false/no/off or empty for no; give $(v)=1 or $(v)=0))))

# Values from the command line and the environment are data, never make code: each is made a
# simple variable holding its literal text (so `$(shell ...)` in a file name is not run when a
# recipe references or exports it), and stays exported as before.
$(foreach v,$(filter-out MAKEFLAGS MFLAGS SHELL,$(.VARIABLES)),$(if $(filter command line environment,\
	$(origin $(v))),$(eval override $(v) := $$(value $(v)))$(eval export $(v))))
PYTHON_GIVEN := $(PYTHON)
BOOTSTRAP_PYTHON ?= python3
VENV := .venv
ifeq ($(PYTHON_GIVEN),)
PYTHON := $(VENV)/bin/python
HOST_PYTHON_READY := $(VENV)/.mics-repro-installed
endif
REPRO = $(PYTHON) -m repro $(if $(call yes,QUIET),--quiet) $(if $(call yes,VERBOSE),--verbose)

# Make variables -> CLI flags (only those given on the command line or in the environment).
# A value is data, never code: `sq` single-quotes it for /bin/sh, so backticks, $(...) and quotes reach the tool as one literal
# argument (tests/project/test_makefile_injection.py runs every target with hostile values).
sq = '$(subst ','\'',$(1))'
flag = $(if $(value $(1)),--$(2) $(call sq,$(value $(1))))
# A custom job's own packages, as a layer over the env: REQUIREMENTS=path/requirements.txt, PACKAGES="a==1 b".
JOB_DEPS_FLAGS = $(call flag,REQUIREMENTS,requirements) $(call flag,PACKAGES,packages)
RUN_FLAGS = $(call flag,ENV,env) $(call flag,ENGINE,engine) $(call flag,TORCH,torch) \
	$(call flag,DEEPSPEED,deepspeed) $(call flag,SCENARIOS,scenarios) $(call flag,PATCH,patch) \
	$(call flag,DTYPE,dtype) $(call flag,TRANSPORT,transport) $(call flag,CONFIG,config) \
	$(call flag,STEPS,steps) $(call flag,WORLD_SIZE,world-size) $(call flag,TIMEOUT,timeout) \
	$(call flag,STALL_TIMEOUT,stall-timeout) $(if $(call yes,NO_SYNC_PROOF),--no-sync-proof) $(call flag,JOBS,jobs) \
	$(call flag,LAUNCHER,launcher) \
	$(call flag,OUT,out) $(call flag,MATRIX,matrix) $(if $(call yes,DRY_RUN),--dry-run)

.PHONY: help list build repro check-fix matrix report base-image test test-unit test-fast lint bench clean venv

# Every target that runs Python needs the host side set up first (nothing to do with PYTHON=).
help list build repro check-fix matrix report base-image test test-unit test-fast lint bench clean: $(HOST_PYTHON_READY)
gpu-check: $(HOST_PYTHON_READY)
bisect survey probe bundle verify-bundle cluster pr-regression pr pr-verify issue: $(HOST_PYTHON_READY)
run shell: $(HOST_PYTHON_READY)
venv: $(HOST_PYTHON_READY)

# Remade when pyproject.toml changes; `-m venv` on an existing .venv/ re-points it at
# BOOTSTRAP_PYTHON and keeps what is installed, so pip only adds what changed.
$(VENV)/.mics-repro-installed: pyproject.toml
	@echo "== setting up the host-side Python in $(VENV)/ (once; again when pyproject.toml changes)"
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --disable-pip-version-check --progress-bar off -q -e ".[dev]"
	@touch $@
	@echo "== host-side Python ready: $(VENV)/bin/python"

# `make help` prints the header above (up to its first bare `#` line), then these lines, one per
# target (tests/project/test_make_help.py checks that every target of this file has one), then the CLI's.
#> Targets (variables in CAPS; docs/ and `python -m repro COMMAND --help` have the details):
#>   make help            this text, then the command-line tool's own help
#>   make venv            set up the host-side Python in .venv/ (every target does it when needed)
#>   make list            the envs of the matrix and whether this host can run them [MATRIX=]
#>   make build           build (or reuse) an env's image or venv [ENV= ENGINE=docker|venv]
#>   make repro           control + MiCS scenarios, stock and fixed, and the verdict [ENV= ENGINE= DRY_RUN=1]
#>   make check-fix       the fixed MiCS scenarios only; fails unless all are clean [ENV=]
#>   make matrix          the reproduction in every env this host can run
#>   make report          report.html and REPORT.md from results folders [RESULTS= OUT=]
#>   make base-image      the local CPU base image, made with debootstrap [FORCE=1]
#>   make gpu-check       prove a GPU host end to end, a verdict per step [ENV= OUT=]
#>   make run             YOUR command in an env, stock and fixed [CMD= ENV= WORKDIR= REQUIREMENTS= PACKAGES=]
#>   make shell           an interactive shell in an env with the hook active [ENV= PATCH=fixed]
#>   make bisect          adjacent releases where MiCS turns bad [AXIS= GOOD= BAD= BAD_IF=]
#>   make survey          every change of outcome across releases [AXIS= FROM= TO= EVERY=1 CMD=]
#>   make probe           one candidate, for `git bisect run`: exit 0 good, 1 bad, 125 unknown
#>   make issue           ISSUE.md for the upstream tracker from a run/bisect/survey folder [RESULTS=]
#>   make bundle          an env's image, results, report, fix and issue text for maintainers [ENV=]
#>   make verify-bundle   load a bundle and rerun it offline against its manifest [BUNDLE=]
#>   make cluster         Slurm/Apptainer and torchrun launchers for a multi-node run [OUT= LAYOUT=]
#>   make pr-regression   the PR's regression test: fails on stock, passes patched
#>   make pr              the fix as a branch of your DeepSpeed clone + patch + PR text [DS_REPO= REF=]
#>   make pr-verify       the lab verifies that branch at its commit, + the affected range [PR= DS_REPO= RANGE=1]
#>   make bench           time one env warm: suite under torchrun and prefork, a probe, reuse
#>   make test            every test tier this host can run [PYTEST_ARGS=]
#>   make test-unit       the fast tier only (fakes, no Docker, no torch)
#>   make test-fast       the inner loop: lint, the unit tier in 2 workers, one real make run
#>   make lint            ruff, ruff format --check, mypy (strict) and the import contracts
#>   make clean           remove results/ and temporary build folders (not the venv/download cache)
#>   make ci-fresh        the CI script on a fresh clone with an empty cache, timed
help:
	@sed -n '/^$$/q; /^#$$/q; s/^# \{0,1\}//p' Makefile
	@echo
	@sed -n 's/^#> \{0,1\}//p' Makefile
	@echo
	@echo "Read more (docs/, by task):"
	@sed -n 's/^| \[docs\/\([a-z-]*\.md\)\](docs\/[a-z-]*\.md) | \(.*\) |$$/  docs\/\1  \2/p' README.md
	@echo
	@$(REPRO) --help

list:
	$(REPRO) list $(call flag,MATRIX,matrix)

build:
	$(REPRO) build $(RUN_FLAGS)

repro:
	$(REPRO) repro $(RUN_FLAGS)

check-fix:
	$(REPRO) check-fix $(RUN_FLAGS)

matrix:
	$(REPRO) matrix $(RUN_FLAGS)

report:
	$(REPRO) report $(call flag,RESULTS,results) $(call flag,OUT,out)

base-image:
	$(REPRO) base-image $(if $(call yes,FORCE),--force)

# The GPU host self-check (repro/run/gpu_check.py): GPUs, the env's venv, torch and DeepSpeed on the
# real backend, repro on the GPUs, check-fix with the GPUs hidden; gpu-check.json + a verdict per step.
.PHONY: gpu-check
gpu-check:
	$(REPRO) gpu-check $(call flag,ENV,env) $(call flag,OUT,out) $(call flag,MATRIX,matrix)

# All tiers: unit (fakes), integration (real torch + DeepSpeed under torchrun, venv engine),
# docker (real engine), browser (headless chromium), bootstrap (a fresh clone and a bare Python
# run `make repro DRY_RUN=1` and `make test`). Tiers whose tools are missing skip with a
# reason, except under MICS_REPRO_REQUIRE_TIERS=1 (CI), where a skip is a failure.
# tests/run_tiers.py: the Docker tier (disk and dockerd bound) in a pytest of its own beside the
# others, which run as before: the unit tier in two workers when pytest-xdist is there (make venv
# installs it), then the other real tiers one test at a time, so real runs never compete with each
# other for the cores and Slurm and signal tests stay serial. The Docker tier's output is printed
# after theirs. Exit 5 (nothing selected, e.g. a PYTEST_ARGS= file of one tier only) is no failure.
test:
	$(PYTHON) tests/run_tiers.py $(PYTEST_ARGS)

test-unit:
	$(PYTHON) -m pytest -m unit $(PYTEST_ARGS)

# The inner loop of a change (docs/developing.md): lint, the unit tier in two workers, and one real
# run (a small DeepSpeed job of "a user's own" through make run on the CPU twin, stock and fixed,
# read back by the summary, check-fix, the report and a bundle's comment). Needs the cpu env's venv
# (`python -m repro venv-python --env cpu`, built once).
FAST_INTEGRATION = tests/verdict/test_verdict_integration.py::test_summary_check_fix_report_and_issue_comment_agree
test-fast: lint
	$(PYTHON) -m pytest -m unit -n 2 -q $(PYTEST_ARGS)
	MICS_REPRO_REQUIRE_TIERS=1 $(PYTHON) -m pytest -q $(FAST_INTEGRATION) $(PYTEST_ARGS)

# Static checks, run by CI before the tests: ruff, mypy (strict, pyproject.toml) and the import
# contracts (lint-imports; [tool.importlinter] in pyproject.toml: layers, no cycles, the workload
# stands alone).
# import-linter has no `python -m` entry point; this runs its `lint-imports` with $(PYTHON).
LINT_IMPORTS = $(PYTHON) -c 'import sys; sys.version_info >= (3, 10) or sys.exit( \
	"lint-imports: import-linter 2.6+ needs Python >= 3.10; run make lint PYTHON=python3.11"); \
	from importlinter.cli import lint_imports_command as c; sys.exit(c())'
lint:
	$(PYTHON) -m ruff check repro tests
	$(PYTHON) -m ruff format --check repro tests
	$(PYTHON) -m mypy
	$(LINT_IMPORTS)

bench:
	$(REPRO) bench $(call flag,ENV,env) $(call flag,ENGINE,engine) $(call flag,DS_REPO,ds-repo) \
		$(call flag,DEEPSPEED_COMMIT,deepspeed-commit) $(if $(call yes,NO_HANG),--no-hang)

# Bisection and surveys over releases (repro/cli/bisect_commands.py; docs/bisect.md).
#   make bisect AXIS=torch GOOD=2.0.1 [BAD=2.3.1] [DEEPSPEED=0.13.1] [BAD_IF=reproduced|failed|differs]
#   make survey AXIS=deepspeed FROM=0.12.6 TO=0.19.8 TORCH=2.1.0 [EVERY=1]
#   make probe ENV=cpu TORCH=2.1.0 [DEEPSPEED_SRC=~/DeepSpeed]   exit 0 good / 1 bad / 125 unknown
#   make bisect AXIS=deepspeed-commit GOOD=v0.19.2 BAD=v0.19.3 DS_REPO=~/DeepSpeed [PARALLEL=2] [RUNNER=slurm]
#   make bisect AXIS=deepspeed GOOD=0.19.0 BAD=0.19.6 COMMITS=1 [DS_REPO=~/DeepSpeed]   releases, then commits
WALK_FLAGS = $(call flag,AXIS,axis) $(call flag,FROM,from) $(call flag,TO,to) $(call flag,VERSIONS,versions) \
	$(if $(call yes,PRERELEASES),--prereleases) $(if $(call yes,REFRESH_VERSIONS),--refresh-versions) \
	$(if $(call yes,DRY_RUN),--dry-run) $(call flag,DS_REPO,ds-repo) $(call flag,PARALLEL,parallel) \
	$(call flag,RUNNER,runner) $(call flag,DEVICES,devices) $(call flag,SLURM_PARTITION,slurm-partition) \
	$(call flag,SLURM_TIME,slurm-time) $(call flag,SLURM_GPUS_PER_TASK,slurm-gpus-per-task) $(call flag,IMAGE,image)
PROBE_FLAGS = $(call flag,ENV,env) $(call flag,ENGINE,engine) $(call flag,TORCH,torch) \
	$(call flag,DEEPSPEED,deepspeed) $(call flag,SCENARIO,scenario) $(call flag,PATCH,patch) \
	$(call flag,DTYPE,dtype) $(call flag,TRANSPORT,transport) $(call flag,STEPS,steps) \
	$(call flag,WORLD_SIZE,world-size) $(call flag,TIMEOUT,timeout) $(call flag,OUT,out) \
	$(call flag,MATRIX,matrix) $(if $(value CMD),--cmd $(call sq,$(value CMD))) $(call flag,WORKDIR,workdir) \
	$(if $(value LOSS_REGEX),--loss-regex $(call sq,$(value LOSS_REGEX))) $(JOB_DEPS_FLAGS)
.PHONY: bisect survey probe
bisect:
	$(REPRO) bisect $(WALK_FLAGS) $(PROBE_FLAGS) $(call flag,GOOD,good) $(call flag,BAD,bad) \
		$(call flag,BAD_IF,bad-if) $(if $(call yes,COMMITS),--commits)

survey:
	$(REPRO) survey $(WALK_FLAGS) $(PROBE_FLAGS) $(if $(call yes,EVERY),--every) $(if $(call yes,COMMITS),--commits)

probe:
	$(REPRO) probe $(PROBE_FLAGS) $(call flag,BAD_IF,bad-if) $(call flag,DEEPSPEED_SRC,deepspeed-src) \
		$(call flag,REFERENCE,reference) $(call flag,DEEPSPEED_COMMIT,deepspeed-commit) $(call flag,DS_REPO,ds-repo)

# Hand-off (repro/cli/upstream_commands.py): a bundle for maintainers, its offline check, cluster scripts,
# and the DeepSpeed-style regression test of the fix (fails on stock, passes patched).
.PHONY: bundle verify-bundle cluster pr-regression pr pr-verify issue
# ISSUE.md for the upstream tracker from a bisect or survey folder (scrubbed like a bundle).
issue:
	$(REPRO) issue $(call flag,RESULTS,results) $(call flag,OUT,out)

bundle:
	$(REPRO) bundle $(call flag,ENV,env) $(call flag,OUT,out) $(call flag,RESULTS,results) \
		$(call flag,GZIP_LEVEL,gzip-level) $(call flag,MATRIX,matrix)

verify-bundle:
	$(REPRO) verify-bundle $(call flag,BUNDLE,bundle) $(call flag,WORKDIR,workdir) $(if $(call yes,ALLOW_PRIVILEGES),--allow-gpu-privileges) \
		$(if $(call yes,REUSE_IMAGE),--reuse-image)

cluster:
	$(REPRO) cluster --out $(call sq,$(or $(value OUT),cluster)) $(call flag,LAYOUT,layout) $(call flag,ENV,env)

pr-regression:
	$(REPRO) pr-regression $(call flag,PYTHON_VENV,python) $(call flag,TRANSPORT,transport)

# The fix as a branch of your DeepSpeed clone, plus the patch and PR_DESCRIPTION.md in OUT (never pushes):
#   make pr DS_REPO=~/DeepSpeed [REF=master] [BRANCH=mics-coalesced-wait] [OUT=dir] [KEEP=1] [AUTHOR_NAME= AUTHOR_EMAIL=]
#   make pr ... VERIFY=1 [RANGE=1]   then the lab verifies the branch at its commit (and the affected range)
#   make pr-verify PR=dir DS_REPO=~/DeepSpeed [TORCHES=2.10.0,2.13.0] [RANGE=1] [RANGE_TORCH=2.1.0,2.13.0] [RELEASES=0.13.1,...] [PARALLEL=2]
PR_VERIFY_FLAGS = $(if $(call yes,VERIFY),--verify) $(if $(call yes,RANGE),--range) $(call flag,ENGINE,engine) \
	$(call flag,TORCHES,torches) $(call flag,RANGE_TORCH,range-torch) $(call flag,RELEASES,releases) \
	$(call flag,PARALLEL,parallel)
pr:
	$(REPRO) pr $(call flag,DS_REPO,ds-repo) $(call flag,REF,ref) $(call flag,BRANCH,branch) $(call flag,OUT,out) \
		$(if $(call yes,KEEP),--keep) $(call flag,AUTHOR_NAME,author-name) $(call flag,AUTHOR_EMAIL,author-email) \
		$(PR_VERIFY_FLAGS)

pr-verify:
	$(REPRO) pr-verify $(call flag,PR,pr) $(call flag,DS_REPO,ds-repo) $(PR_VERIFY_FLAGS)

# Your own command in an env, stock and fixed, judged from its own output (docs/own-job.md;
# repro/cli/job_commands.py). CMD (and LOSS_REGEX) are passed as written, in single quotes: it may
# hold double quotes, and $VARS in it expand in the job's shell, not in make.
#   make run ENV=cpu WORKDIR=~/proj CMD="torchrun --nproc_per_node 2 train.py" [PATCH=stock,fixed]
#   make run ... REQUIREMENTS=~/proj/requirements.txt   the job's packages over the env (pins kept)
#   make shell ENV=cpu [PATCH=fixed]      an interactive shell in the env with the hook active
.PHONY: run shell
run:
	$(REPRO) run --cmd $(call sq,$(value CMD)) $(call flag,ENV,env) $(call flag,ENGINE,engine) \
		$(call flag,PATCH,patch) $(call flag,WORKDIR,workdir) $(call flag,TRANSPORT,transport) \
		$(if $(value LOSS_REGEX),--loss-regex $(call sq,$(value LOSS_REGEX))) $(call flag,TIMEOUT,timeout) \
		$(call flag,STALL_TIMEOUT,stall-timeout) $(call flag,OUT,out) $(call flag,MATRIX,matrix) \
		$(if $(call yes,NETWORK),--network) $(call flag,DEEPSPEED_SRC,deepspeed-src) $(JOB_DEPS_FLAGS)

shell:
	$(REPRO) shell $(call flag,ENV,env) $(call flag,ENGINE,engine) $(call flag,PATCH,patch) \
		$(call flag,TRANSPORT,transport) $(call flag,MATRIX,matrix) $(JOB_DEPS_FLAGS)

clean:
	$(REPRO) clean

# .ci/run as a new machine runs it: a fresh clone of HEAD, system PATH, HOME and an empty
# MICS_REPRO_CACHE in a temp dir (CACHE=~/.cache/mics-repro: a used machine). Prints its time.
.PHONY: ci-fresh
ci-fresh:
	bash .ci/fresh
