"""max_waiting_tokens under a steady stream of short prompts: a long prompt (within max_model_len) retried at every
step is refused 'queue_full' every time while every short prompt that arrives meanwhile is admitted -- the bound
'queued + new > max_waiting_tokens' lets short prompts take any room that opens, so a long one never fits while the
load lasts. Also checks that the bound itself holds (queued tokens never pass it) and nothing leaks."""
from _hl import AdmissionError, check, done, engine, greedy, leftovers, prompt

BOUND = 512
eng, _ = engine(kv_cache_tokens=4096, max_model_len=512, max_num_seqs=4, max_waiting=16, max_waiting_tokens=BOUND,
                max_num_batched_tokens=64, prefix_caching=False)
LONG = prompt(400, seed=1)
short_ok = short_refused = long_tries = 0
long_in = None
peak_q = 0
STEPS = 200
for step in range(STEPS):
    for k in range(2):                              # two short requests arrive a step (48 prompt tokens each): more
        try:                                        # than a 64-token budget serves -- the engine is overloaded
            eng.add_request(prompt(48, seed=1000 + 2 * step + k), greedy(4), f"s{step}-{k}")
            short_ok += 1
        except AdmissionError as e:
            assert e.reason == "queue_full", e
            short_refused += 1
    if long_in is None and step >= 10:              # (once the overload has built a queue)                             # the long client retries at every step
        long_tries += 1
        try:
            eng.add_request(LONG, greedy(4), "long")
            long_in = step
        except AdmissionError as e:
            assert e.reason == "queue_full", e
    peak_q = max(peak_q, eng.queued_tokens())
    eng.step()
print(f"short: {short_ok} admitted, {short_refused} refused; long: tries {long_tries}, admitted at step {long_in}; "
      f"peak queued tokens {peak_q}")
check(peak_q <= BOUND, f"queued prompt tokens stayed within max_waiting_tokens ({peak_q} <= {BOUND})")
check(long_in is not None, f"the 400-token prompt (max_model_len 512, max_waiting_tokens {BOUND}) was admitted while "
      f"{short_ok} short prompts were ({long_tries} tries over {STEPS} steps)")
for _ in range(3000):
    if not eng.has_work():
        break
    eng.step()
check(not leftovers(eng), f"engine empty at the end: {leftovers(eng)}")
done()
