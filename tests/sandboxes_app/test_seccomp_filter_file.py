"""The compiled syscall filter is written once per root, safely when sandboxes start at once."""

import stat
import threading

from sandboxes_app.providers.local_seccomp import seccomp_bpf_path


def test_threads_that_find_no_filter_at_once_all_get_it(tmp_path):
    # Five first requests of one process each start a sandbox: they used to share one temporary
    # name, and whichever renamed it second failed its provisioning (502).
    barrier = threading.Barrier(8)
    paths, errors = [], []

    def start() -> None:
        barrier.wait()
        try:
            paths.append(seccomp_bpf_path(root=tmp_path))
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(set(paths)) == 1
    (path,) = set(paths)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
