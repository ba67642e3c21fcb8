"""A watcher source read under another trainer's metric names (`ladder watch --keys ...`):
:class:`KeyMappedSource` asks the wrapped source for the trainer's names of the keys the watcher
wants (a ``KeyMap``) and hands back rows or columns under ours, values scaled. Everything else
is the wrapped source's."""

from __future__ import annotations

from ladder.sources.base import Poll, Source, SourceWrapper
from ladder.sources.batch import KeyFilter


class KeyMappedSource(SourceWrapper):
    def __init__(self, source: Source, keymap):
        super().__init__(source)
        self.keymap = keymap

    def poll(self) -> Poll:
        return self._mapped(self._source.poll())

    def poll_batch(self, keys, keep) -> Poll:
        km = self.keymap
        their_keys = None if keys is None else sorted(set(km.source_keys(keys)) | set(keys))
        if isinstance(keep, KeyFilter):
            their_keep = KeyFilter(frozenset(km.source_keys(keep.fixed)) | keep.fixed,
                                   keep.prefixes)
        elif keep is None:
            their_keep = None
        else:  # any other filter: asked about our name of a key
            back = {t: o for o, t, _ in km.entries}
            their_keep = _Back(keep, back)
        return self._mapped(self._source.poll_batch(their_keys, their_keep))

    def _mapped(self, p: Poll) -> Poll:
        p.rows = [self.keymap.row(r) for r in p.rows]
        if p.batch is not None:
            self.keymap.batch(p.batch)
        return p


class _Back:
    """A key filter of our names asked about the trainer's (picklable)."""

    def __init__(self, keep, back: dict):
        self.keep, self.back = keep, back

    def __call__(self, k: str) -> bool:
        return self.keep(self.back.get(k, k)) or self.keep(k)


__all__ = ["KeyMappedSource"]
