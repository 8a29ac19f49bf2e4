"""Every limit a spec file or a command line is held to, in one place, each with its reason.

A spec that goes past a limit gets a located error at `validate` time (exit 2), never a hang,
a memory blow-up or a crash at run time. docs/specs.md § "Limits" lists the same numbers for users;
change both together.

The numbers leave a wide margin over what the shipped specs use (the largest file is 1.7 KB,
the deepest nesting 6, the largest kernel 8.3 M elements) while keeping the worst case a
hostile file can reach to seconds and a few hundred MB on a 2-core CI machine.
"""

# --------------------------------------------------------------------------- the YAML document
# The pure-Python YAML parser (the C one recurses on the C stack, so nesting could crash the
# process) composes about 10 k nodes a second on a loaded 2-core machine: 64 KiB is at most
# ~32 k nodes, a few seconds in the worst case, and 38 times the largest spec shipped.
MAX_SPEC_BYTES = 64 * 1024
# Nesting deeper than this is never a real spec (they nest at most 6 levels) and bounds the
# recursion of every walk over the document far below Python's recursion limit.
MAX_NESTING = 32
# Aliases (*name) are what a "billion laughs" document multiplies; no shipped spec uses one.
MAX_ALIASES = 64
# Nodes after every alias is expanded: what validation, hashing and the runners really see.
MAX_YAML_NODES = 100_000
# Integer literals longer than this are not int64 values (0b + 64 binary digits is 66 characters);
# it also keeps Python's int parser from spending time on a megabyte of digits.
MAX_INT_CHARS = 100

# --------------------------------------------------------------------------- sizes a spec may ask for
# Values of one generated integer sequence ({arange: ...}, {hashed: ...}): 32 MiB as int64.
MAX_GENERATED = 1 << 22
# Cells of a coins grid (rows x columns, and rows x (N + 1) coins): 32 MiB per int64 output,
# computed on two backends; the largest shipped grid has 131 072 cells.
MAX_COIN_CELLS = 1 << 22
# Keys of a coins spec in keys mode: the hash runs on the k x k grid of its keys, so 2048 keys
# are 4 M cells, the same bound as a grid.
MAX_COIN_KEYS = 2048
# Elements of the tensors one kernel spec allocates (inputs, weights, output): 32 M elements
# are 128 MiB in fp32, four times the largest shipped kernel spec (matmul 2881 x 2881).
MAX_KERNEL_ELEMENTS = 1 << 25
# Parameters of a checkpoint a spec makes from a preset: 64 M (the largest test preset has 3.2 M);
# the real gpt-oss presets (21 B and 117 B parameters) would write 40 to 230 GB.
MAX_CHECKPOINT_PARAMS = 1 << 26
# Tokens of one request (prompt + max_new_tokens), and of a layer_ids forward's prompt: the CPU
# engine walks every key of every query, so 4096 tokens already take minutes; shipped specs use
# at most 268.
MAX_REQUEST_TOKENS = 4096
# Requests of one generate spec (shipped specs use at most 8).
MAX_REQUESTS = 256
# Speculative decoding of a spec: draft steps per round, children per node, and tree nodes.
# Shipped specs use at most 3, 3 and 8 (SGLang's EAGLE3 defaults are of that order); without a
# bound, num_steps: 1000000000 passes the engine's own checks and drafts forever.
MAX_DRAFT_STEPS = 32
MAX_DRAFT_TOPK = 32
MAX_DRAFT_TOKENS = 256
# Requests (seeds) of one distribution spec: each is a speculative generation (the shipped ones
# use 2000 and take minutes); the exact law needs V^(K-1) forwards, bounded in the kind itself.
MAX_DISTRIBUTION_SEEDS = 20_000

# --------------------------------------------------------------------------- the command line
# Tensor / expert parallel degrees `--world-size` accepts: DESIGN D4's TP in {1, 2, 4, 8}.
WORLD_SIZES = (1, 2, 4, 8)
# `replay --dp` / `import-peer --dp`: data-parallel ranks on this host, a whole model each (a process
# and its copy of the weights per rank); torchrun's world is not bounded by it.
MAX_DATA_PARALLEL = 64
# `lockstep generate` on the CPU refuses a run estimated (harness/estimates.py) above this many
# seconds unless --max-seconds raises it: a 5 000-token prompt on the tiny preset takes ~20 minutes.
MAX_GENERATE_SECONDS = 300
# `lockstep make-checkpoint` refuses to write more parameter bytes than this unless --max-gb raises
# it: the largest test preset writes 6 MB; the real gpt-oss presets 14 to 234 GB, made in memory first.
MAX_CHECKPOINT_GB = 1.0
# `lockstep record` refuses a KV cache (harness/estimates.py: kv_cache_bytes) larger than this unless
# --max-gb raises it: the shipped request files need well under 1 MB; 10^6 requests asked for 32 GB.
MAX_RECORD_GB = 4.0
# Requests of one `lockstep record` (a request file's lines): the shipped ones hold at most a few;
# parsing 10^6 lines took minutes on the CI machine before the KV-cache estimate could refuse them.
MAX_RECORD_REQUESTS = 4096
# `lockstep doctor --inputs` above this is refused: each op holds a few float64 tensors of this many
# inputs (4 M: about 200 MB in all); 10^12 used to end in a MemoryError.
MAX_DOCTOR_INPUTS = 1 << 22

# --------------------------------------------------------------------------- files a command reads
# Nesting of a JSON value Lockstep reads (a trace, request or peer line, a manifest): json's decoder
# and every walk over the result recurse; the trace format nests at most 5 levels.
MAX_JSON_NESTING = 64
# Bytes of an expectations file (harness/targets/expectations): the shipped ones are under 8 KB.
MAX_EXPECTATIONS_BYTES = 1 << 20
