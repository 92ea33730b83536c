"""A node's first training job and its first audit replay start at once, in two threads: the first
optimizer's constructor imports torch._dynamo and the first `use_deterministic_algorithms` torch._inductor,
and two such first imports at once break each other for the life of the process ("cannot import name
'IndentedBuffer' from partially initialized module torch._inductor.utils": a joiner that was also a
verifier failed its job and every audit this way). ml.train.reproducibility imports them once, first; each
check runs in a fresh interpreter, where nothing torch imports lazily is loaded yet."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RACE = """
import threading
import torch
import ml.train.reproducibility  # what every trainer imports first
barrier, errors = threading.Barrier(2), []
def determinism():
    barrier.wait()
    try:
        torch.use_deterministic_algorithms(True)
    except Exception as exc:
        errors.append(repr(exc))
def optimizer():
    barrier.wait()
    try:
        import torch._dynamo  # what an optimizer's first constructor does (torch/_compile.py)
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=determinism), threading.Thread(target=optimizer)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors)
"""


def test_a_first_optimizer_and_a_first_determinism_call_in_two_threads_both_work():
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", RACE], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "[]", done.stdout
