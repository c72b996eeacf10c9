"""Random-interleaving simulation of the Gluon FP8 kernel's barrier protocol with SKIP_PAD and EPI
(benchmarks/experiments/gluon_epilogue.py): no deadlock, every stage read holds the (tile, k) expected, every
epilogue buffer read holds the tile expected, every tile's rows stored once. `python gluon_protocol_sim.py`."""

import random


class Bar:
    def __init__(self, count):
        self.count, self.pending, self.phase = count, 0, 0

    def arrive(self):
        self.pending += 1
        assert self.pending <= self.count
        if self.pending == self.count:
            self.pending, self.phase = 0, self.phase + 1

    def done(self, parity):  # try_wait.parity: the phase of that parity has completed
        return (self.phase & 1) != parity


def sim(seed):
    rnd = random.Random(seed)
    STAGES = rnd.randint(2, 4)
    num_k = rnd.randint(1, 6)
    CONS = 2
    SKIP, EPI = rnd.random() < 0.7, rnd.random() < 0.7
    tiles = []
    for _ in range(rnd.randint(0, 8)):
        tiles.append((rnd.random() < 0.2, rnd.random() < 0.4))  # (expert -1, half 1 all padding)
    ready = [Bar(1) for _ in range(STAGES)]
    empty = [Bar(CONS) for _ in range(STAGES)]
    efull = [Bar(1) for _ in range(CONS)]
    eempty = [Bar(1) for _ in range(CONS)]
    stage_content = [None] * STAGES
    inflight = []  # TMA copies: (stage, content)
    ebuf = [None] * CONS
    stored = []

    def producer():
        step = 0
        for t, (unused, _) in enumerate(tiles):
            if unused:
                continue
            for k in range(num_k):
                s = step % STAGES
                yield lambda: empty[s].done(((step // STAGES) & 1) ^ 1)
                stage_content[s] = None  # overwritten from now on
                inflight.append((s, (t, k)))
                step += 1

    def consumer(c):
        step = 0
        handed = 0

        def use(st, t, k):
            s = st % STAGES
            assert stage_content[s] == (t, k), (c, st, stage_content[s], (t, k))

        def wait_ready(st):
            s = st % STAGES
            return lambda: ready[s].done((st // STAGES) & 1)

        for t, (unused, pad) in enumerate(tiles):
            if unused:
                continue
            if SKIP and c == 1 and pad:
                for _ in range(num_k):  # _drain
                    yield wait_ready(step)
                    empty[step % STAGES].arrive()
                    step += 1
                continue
            # _k_loop: consumer 1 takes block 0 alone
            blocks = []
            k0 = 0
            if c == 1:
                blocks.append([0])
                k0 = 1
            k = k0
            while k < num_k - 1:
                blocks.append([k, k + 1])
                k += 2
            if (num_k - k0) % 2 == 1:
                blocks.append([num_k - 1])
            for grp in blocks:
                for j, kk in enumerate(grp):
                    yield wait_ready(step + j)
                    use(step + j, t, kk)
                for j, kk in enumerate(grp):
                    yield None  # time passes: the wgmma reads
                    use(step + j, t, kk)
                    empty[(step + j) % STAGES].arrive()
                step += len(grp)
            if EPI:
                h = handed
                yield lambda: eempty[c].done((h & 1) ^ 1)
                ebuf[c] = t
                efull[c].arrive()
                handed += 1
            else:
                stored.append((t, c))

    def epilogue():
        taken = [0, 0]
        for t, (unused, pad) in enumerate(tiles):
            if unused:
                continue
            for c in range(CONS):
                if c == 1 and SKIP and pad:
                    continue
                n = taken[c]
                yield lambda: efull[c].done(n & 1)
                assert ebuf[c] == t, (c, ebuf[c], t)
                yield None
                assert ebuf[c] == t
                stored.append((t, c))
                eempty[c].arrive()
                taken[c] += 1

    parts = [producer(), consumer(0), consumer(1)] + ([epilogue()] if EPI else [])
    waits = [None] * len(parts)
    alive = list(range(len(parts)))
    for _ in range(100000):
        # complete a TMA copy now and then
        if inflight and rnd.random() < 0.3:
            s, content = inflight.pop(0)
            stage_content[s] = content
            ready[s].arrive()
        runnable = [i for i in alive if waits[i] is None or waits[i]()]
        if not runnable:
            if inflight:
                continue
            if not alive:
                break
            raise AssertionError(f"deadlock seed {seed}: {alive}")
        i = rnd.choice(runnable)
        try:
            waits[i] = next(parts[i])
        except StopIteration:
            alive.remove(i)
        if not alive and not inflight:
            break
    want = sorted((t, c) for t, (u, p) in enumerate(tiles) if not u for c in range(CONS) if not (SKIP and c == 1 and p))
    assert sorted(stored) == want, (seed, stored, want)
    assert all(b.pending == 0 for b in empty), seed


for seed in range(20000):
    sim(seed)
print("20000 random schedules: no deadlock, every read matched")
