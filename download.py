"""Resumable downloads over HTTP: download(url, dest) fetches a file through dest.part and renames it into place
only when whole; a rerun after an interruption asks the server for the rest (a Range request, If-Range the version
the .part holds), and every way a server can answer a resume wrongly is one sentence. Optional reading, plumbing:
it imports cli.py and files.py only (data.py fetches the corpora and GPT-2's files through it).
"""
import http.client
import time
import urllib.error
import urllib.request

from cli import DataError, end_progress, fmt_count, say, short_repr, show_progress
from files import atomic_file, rename_synced

NET_ERRORS = (OSError, http.client.HTTPException)  # a failed download: a reply cut short or garbled is no OSError


def download(url, dest):
    """Fetch url into dest via dest.part: a rerun after an interruption asks the server for the
    rest only (an HTTP Range request) and appends. dest (a Path) appears, by rename, only when complete: as long as
    the server says the file is, asking again for the rest while a reply holds less (RFC 9110 15.3.7: a 206's
    Content-Range says what it holds); a reply of other bytes than asked, or a size that disagrees, is one sentence.
    dest.part.version keeps the server's name for the version the .part holds (its strong ETag, else its
    Last-Modified), sent back as If-Range: a server whose file has changed since sends the new one whole,
    where appending its tail would have made a file of two versions."""
    part = dest.with_name(dest.name + ".part")
    version = part.with_name(part.name + ".version")
    total, shown, t0 = None, None, None  # total: the file's size, once a reply has said it; t0: the first reply's time
    while True:
        have = part.stat().st_size if part.exists() else 0
        try:
            resp = urllib.request.urlopen(range_request(url, version, have), timeout=30)
        except urllib.error.HTTPError as e:
            if e.code != 416 or not have:  # 416 "range not satisfiable": the .part holds every byte, or another file's
                raise
            if part_is_whole(e, url, part, have, total):
                break
            continue  # deleted (another file's bytes): asked for again, whole
        with resp:
            start, stop, size = reply_span(resp, url, part, have)
            if total is not None and size not in (None, total):
                raise sizes_disagree(url, part, total, f"{size:,}")
            total = total if size is None else size
            if start == 0:  # a whole file: the version it is
                keep_version(resp, version)
            if t0 is None:
                t0 = time.time()
                say(f"downloading {url} ({'size not given' if total is None else fmt_count(total) + 'B'}"
                    + (f", {fmt_count(start)}B of it already here" if start else "") + ")")
            done, shown = receive(resp, part, (start, stop, total), dest.name, (t0, shown))
        if done == total or total is None and stop is None:  # (a reply of no stated size ends where the file does)
            break
        if done <= have:  # this reply added nothing: the server stopped
            end_progress()
            raise DataError(f"the download of {url} stopped at {done}" + ("" if total is None else f" of {total}")
                            + " bytes; run the same command again to resume it.")
    end_progress()
    rename_synced(part, dest)
    version.unlink(missing_ok=True)
    return dest


def range_request(url, version, have):
    """A request for url's bytes from `have` on (all of them: have 0), If-Range the version the .part holds."""
    headers = {"Range": f"bytes={have}-"} if have else {}
    held = version.read_text(encoding="ascii", errors="replace").strip() if have and version.exists() else ""
    if held.isascii() and held:  # else (no record, or one edited by hand) the range alone
        headers["If-Range"] = held
    return urllib.request.Request(url, headers=headers)


def part_is_whole(e, url, part, have, total):
    """A 416 to a request for the bytes from `have` on: True if the .part is the whole file (it has the size the
    reply says, if it says one); False after deleting a .part of a longer file the server has since replaced; the
    one sentence (sizes_disagree) if an earlier reply said the file was larger."""
    if total is not None:  # asked for the rest of a file this download was told is larger
        raise sizes_disagree(url, part, total, f"that bytes from {have:,} on are past its end")
    size = e.headers.get("Content-Range", "").rpartition("/")[2]  # "bytes */SIZE"
    if size.isdigit() and int(size) != have:
        say(f"{part.name} holds {have:,} bytes, but {url} has {int(size):,}: downloading it again")
        part.unlink()
        return False
    return True


def reply_span(resp, url, part, have):
    """(its first byte's place in the file, the place after its last or None, the file's size or None) for the reply
    to range_request: a 200 holds the whole file, whose size is its Content-Length, if given; a 206 what its
    Content-Range says, which must begin at `have` (else DataError: nothing is written)."""
    if resp.status != 206:  # a server that ignores Range (or whose file changed: If-Range) sends it all
        size = resp.headers.get("Content-Length", "")
        size = int(size) if size.isdigit() else None
        return 0, size, size
    said = resp.headers.get("Content-Range", "")
    first, _, rest = said.removeprefix("bytes ").partition("-")
    last, _, size = rest.partition("/")
    if not (first.isdigit() and last.isdigit() and int(first) == have <= int(last)
            and (size == "*" or size.isdigit() and int(last) < int(size))):
        what = short_repr(said) if said else "no"
        raise DataError(f"{url} answered a request for its bytes from {have:,} on with {what} Content-Range, not those "
                        f"bytes; {part} is kept as it was: run the same command again later, or download the file from "
                        "another server.")
    return have, int(last) + 1, int(size) if size.isdigit() else None


def sizes_disagree(url, part, said, says):  # a file's size changed under its download: its .part may mix two versions
    part.unlink(missing_ok=True)
    part.with_name(part.name + ".version").unlink(missing_ok=True)
    return DataError(f"{url} said its file has {said:,} bytes, then {says}: it changed during the download, or the "
                     f"server is faulty; {part.name} was deleted: run the same command again to download it anew.")


def keep_version(resp, version):  # the version a whole reply is (If-Range takes no weak ETag), for a later resume
    etag = resp.headers.get("ETag", "")
    tag = etag if etag.startswith('"') else resp.headers.get("Last-Modified")
    if tag:
        with atomic_file(version, "w") as f:
            f.write(tag)
    else:
        version.unlink(missing_ok=True)


def receive(resp, part, span, name, progress):
    """The reply's bytes into part from byte start on (up to stop, if known), with a progress line: span is (start,
    stop, the file's size), progress (the download's start time, when its line was last shown). Returns (the bytes
    part holds, when the line was last shown)."""
    (start, stop, total), (t0, shown) = span, progress
    done = start
    with open(part, "ab" if start else "wb") as f:
        while chunk := resp.read(1 << 20 if stop is None else min(1 << 20, stop - done)):  # 1 MiB: the line moves often
            f.write(chunk)
            done += len(chunk)
            pct = f"[{'#' * int(30 * done / total):<30}] {100 * done / total:5.1f}%, " if total else ""
            rate = done / 1e6 / (time.time() - t0 + 1e-9)
            shown = show_progress(f"  {name} {pct}{done / 1e6:,.1f} MB, {rate:.1f} MB/s", shown, last=done == total)
    return done, shown
