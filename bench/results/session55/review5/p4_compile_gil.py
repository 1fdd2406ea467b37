import sys, time, json, threading
sys.path.insert(0, '.')
from common import *
eng, tok = engine()
vals = [f"option value {i}" for i in range(7000)]
ticks = []
stop = False
def ticker():
    while not stop:
        t = time.perf_counter(); time.sleep(0.01); ticks.append(time.perf_counter() - t)
th = threading.Thread(target=ticker); th.start()
time.sleep(0.2)
t = time.time()
eng.guides.guide(json.dumps({"enum": vals}), [1])
print(f"compile {time.time()-t:.2f}s; longest tick gap during it {max(ticks)*1000:.0f} ms over {len(ticks)} ticks")
stop = True; th.join()
