#!/usr/bin/python3
"""The programs the tests, tools and benchmarks run must come from a Debian
package that a new machine has: an essential package, apt, a package that
tools/deps.sh installs, or what those depend on.

  programs.py SRCDIR

Finds the programs named in the tracked tests/, tools/, bench/, deploy/ and
examples/ files: in shell, the command words (after `;`, `|`, `&&`,
`$(`, `then`, `do`, ..., past `exec`, `env`, `timeout N`, assignments);
in Python, the first string of an argument list (`["zstd", "-d"]`), the
program of a wrapper called with `*args`, `shutil.which("x")` and the
command of `sh -c`/`bash -c`; in meson.build, `find_program('x')`;
anywhere, an absolute /usr/bin, /bin, /usr/sbin or /sbin path. Each name
found on a plain PATH is looked up with `dpkg -S`; a name that comes from
no package, or from a package neither essential nor reached from
`tools/deps.sh --list` through Depends and Pre-Depends, is reported with
the files that name it. Names not on this machine at all (project
binaries, shell functions of other files) are not judged. Exit 0 clean,
1 findings, 77 (skip) without dpkg."""
import ast
import os
import re
import shutil
import subprocess
import sys

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ABS = re.compile(r"(?<![\w./-])(/(?:usr/)?s?bin/[A-Za-z0-9_.+-]+)")
# Python calls that run their first argument.
RUNNERS = {"run", "Popen", "check_output", "check_call", "call", "execv",
           "execvp", "execvpe", "spawnv", "spawnvp", "getoutput",
           "getstatusoutput", "create_subprocess_exec"}
# Shell words that run their arguments (the next command word follows).
WRAPPERS = {"exec", "command", "nohup", "setsid", "nice", "ionice", "env",
            "timeout", "stdbuf", "taskset", "time", "sudo", "chroot",
            "unshare", "setpriv", "runuser", "xargs", "builtin", "then",
            "do", "else", "elif", "if", "while", "until", "!", "{", "(",
            "((", "[[", "coproc", "eval"}
KEYWORDS = {"fi", "done", "esac", "}", ")", "in", "function", "select",
            "for", "case", "return", "local", "declare", "export",
            "readonly", "typeset", "unset", "shift", "set", "trap", "wait",
            "source", ".", "cd", "pushd", "popd", "read", "mapfile",
            "readarray", "printf", "echo", "test", "[", "true", "false",
            ":", "exit", "break", "continue", "let", "shopt", "ulimit",
            "umask", "kill", "jobs", "fg", "bg", "disown", "hash", "type",
            "getopts", "alias", "unalias", "dirs", "pwd", "caller",
            "compgen", "complete", "enable", "help", "history", "logout",
            "times", "suspend", "bind", "fc"}
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
OPS = ("&&", "||", ";;", ";&", "|&", ";", "|", "&", "(", ")", "`", "\n")


def shell_words(text):
    """(word, command_position) pairs of a shell text, quotes removed;
    $( and backticks open a new command; heredoc bodies are skipped."""
    out = []
    i, n = 0, len(text)
    cmdpos = True
    heredocs = []
    word = None

    def end_word():
        nonlocal word, cmdpos
        if word is not None:
            out.append((word, cmdpos))
            cmdpos = False
            word = None

    while i < n:
        c = text[i]
        if c == "\n":
            end_word()
            if heredocs:
                for tag in heredocs:  # skip each body up to its tag line
                    j = i + 1
                    while j < n:
                        k = text.find("\n", j)
                        k = n if k < 0 else k
                        if text[j:k].strip() == tag:
                            i = k
                            break
                        j = k + 1
                    else:
                        i = n
                heredocs = []
            out.append(("\n", None))
            cmdpos = True
            i += 1
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2
                continue
            word = (word or "") + text[i + 1]
            i += 2
            continue
        if c == "#" and word is None:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            word = (word or "") + text[i + 1:j]
            i = j + 1
            continue
        if c == '"':
            # a double-quoted string: its $( ... ) parts are commands
            j = i + 1
            s = ""
            while j < n and text[j] != '"':
                if text[j] == "\\":
                    s += text[j:j + 2]
                    j += 2
                    continue
                if text.startswith("$(", j) and not text.startswith("$((", j):
                    depth, k = 1, j + 2
                    while k < n and depth:
                        depth += {"(": 1, ")": -1}.get(text[k], 0)
                        k += 1
                    out.extend(shell_words(text[j + 2:k - 1]))
                    s += "$()"
                    j = k
                    continue
                s += text[j]
                j += 1
            word = (word or "") + s
            i = j + 1
            continue
        if text.startswith("$(", i) and not text.startswith("$((", i):
            end_word()
            out.append(("$(", None))
            cmdpos = True
            i += 2
            continue
        if text.startswith("$((", i) or text.startswith("${", i):
            close = "))" if text[i + 1] == "(" else "}"
            j = text.find(close, i)
            j = n if j < 0 else j + len(close)
            word = (word or "") + text[i:j]
            i = j
            continue
        if text[i:i + 2] in ("<(", ">("):  # process substitution
            end_word()
            out.append(("$(", None))
            cmdpos = True
            i += 2
            continue
        if text.startswith("<<", i) and not text.startswith("<<<", i):
            m = re.match(r"<<-?\s*(['\"]?)([A-Za-z0-9_]+)\1", text[i:])
            if m:
                end_word()
                heredocs.append(m.group(2))
                i += m.end()
                continue
        for op in OPS:
            if text.startswith(op, i):
                end_word()
                out.append((op, None))
                cmdpos = op not in (")",)
                i += len(op)
                break
        else:
            if c in "<>":
                end_word()
                # a redirection: its target is not a command
                m = re.match(r"[0-9]*[<>]+&?-?\s*", text[i:])
                i += m.end() if m else 1
                if text[i:i + 2] in ("<(", ">("):
                    continue
                j = i
                while j < n and text[j] not in " \t\n;|&)":
                    j += 1
                i = j
                continue
            word = (word or "") + c
            i += 1
    end_word()
    return out


def shell_commands(text):
    """Names in command position of a shell text, and the functions it
    defines."""
    names, funcs = [], set()
    words = shell_words(text)
    case_depth = 0
    pattern = False
    skip_next = 0
    i = 0
    while i < len(words):
        w, pos = words[i]
        i += 1
        if pos is None:  # an operator
            if w in (";;", ";&") and case_depth:
                pattern = True
            continue
        if w == "case":
            case_depth += 1
            while i < len(words) and words[i][0] != "in":
                i += 1
            i += 1
            pattern = True
            continue
        if w == "esac":
            case_depth -= 1
            pattern = False
            continue
        if pattern:  # skip the arm's pattern up to its ")"
            while i < len(words) and words[i][0] != ")":
                i += 1
            i += 1
            pattern = False
            # the command after ")" is in command position
            if i < len(words) and words[i][1] is False:
                words[i] = (words[i][0], True)
            continue
        if not pos:
            continue
        if i < len(words) and words[i][0] == "(" and i + 1 < len(words) \
                and words[i + 1][0] == ")":
            funcs.add(w)
            continue
        if w == "function" and i < len(words):
            funcs.add(words[i][0].rstrip("()"))
            i += 1
            continue
        if ASSIGN.match(w) or w in WRAPPERS:
            # the next word is a command again: skip options and a
            # number (timeout 10, nice -n 5), VAR=x of env
            while i < len(words) and words[i][1] is not None:
                nxt = words[i][0]
                if nxt.startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?", nxt) \
                        or ASSIGN.match(nxt):
                    i += 1
                    continue
                break
            if i < len(words) and words[i][1] is not None:
                words[i] = (words[i][0], True)
            if w in ("exec", "command") and i < len(words) and words[i][0] == "-v":
                i += 2
            continue
        if w in KEYWORDS:
            continue
        if skip_next:
            skip_next -= 1
            continue
        if "$" in w or "*" in w or w.startswith("-"):
            continue
        names.append(w)
        # sh -c / bash -c "..." run a command line of their own
        if w in ("sh", "bash", "/bin/sh", "/bin/bash") and i + 1 < len(words) \
                and words[i][0] == "-c":
            names.extend(shell_commands(words[i + 1][0])[0])
    return names, funcs


def call_name(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def py_programs(tree):
    names = []
    # wrappers: def f(*args) whose body runs args
    wrappers = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.args.vararg:
            v = fn.args.vararg.arg
            for c in ast.walk(fn):
                if isinstance(c, ast.Call) and call_name(c.func) in RUNNERS and c.args \
                        and any(isinstance(x, ast.Name) and x.id == v
                                for x in ast.walk(c.args[0])):
                    wrappers.add(fn.name)
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            e = node.elts
            if isinstance(e[0], ast.Constant) and isinstance(e[0].value, str):
                names.append(e[0].value)
                if e[0].value in ("sh", "bash", "/bin/sh", "/bin/bash") and len(e) > 2 \
                        and isinstance(e[1], ast.Constant) and e[1].value == "-c" \
                        and isinstance(e[2], ast.Constant) and isinstance(e[2].value, str):
                    names.extend(shell_commands(e[2].value)[0])
        if isinstance(node, ast.Call) and node.args:
            a = node.args[0]
            name = call_name(node.func)
            if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                continue
            if name in wrappers or name == "which":
                names.append(a.value)
            elif name in RUNNERS and any(k.arg == "shell" for k in node.keywords):
                names.extend(shell_commands(a.value)[0])
    return names


def tracked(src):
    try:
        files = subprocess.run(["git", "-C", src, "ls-files"], capture_output=True,
                               text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.relpath(os.path.join(d, f), src)
                 for d, _, fs in os.walk(src) for f in fs]
    keep = []
    for f in files:
        if not f or "/corpus/" in f or f.startswith("tests/lint/programs.py"):
            continue
        top = f.split("/")[0]
        if top in ("tests", "tools", "bench", "examples", "deploy") or f == "meson.build":
            keep.append(f)
    return keep


def kind(path):
    if path.endswith(".py"):
        return "py"
    if path.endswith(".sh"):
        return "sh"
    if path.endswith("meson.build"):
        return "meson"
    try:
        with open(path, "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return None
    if first.startswith(b"#!") and b"python" in first:
        return "py"
    if first.startswith(b"#!") and (b"sh" in first):
        return "sh"
    return None


def resolve(name):
    if name.startswith("/"):
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    if "/" in name or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        return None
    return shutil.which(name, path=PATH)


def owners(paths):
    """path -> package, through dpkg -S (merged /usr and alternatives)."""
    cands = {}
    for p in paths:
        c = [p, os.path.realpath(p)]
        for q in list(c):
            c.append(q[4:] if q.startswith("/usr/") else "/usr" + q)
        cands[p] = list(dict.fromkeys(c))
    every = sorted({q for c in cands.values() for q in c})
    cp = subprocess.run(["dpkg", "-S"] + every, capture_output=True, text=True)
    found = {}
    for line in cp.stdout.splitlines():
        if ": " not in line or line.startswith("diversion "):
            continue
        pkgs, path = line.split(": ", 1)
        for pkg in pkgs.split(", "):
            found.setdefault(path, pkg.split(":")[0])
    return {p: next((found[q] for q in c if q in found), None) for p, c in cands.items()}


def allowed(src):
    """Essential packages, apt (tools/deps.sh runs apt-get), tools/deps.sh's
    packages, and their Depends closure (installed packages): what
    `mmdebstrap --variant=apt` plus tools/deps.sh leave on a machine."""
    fmt = "${Package}\t${Essential}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\t${Provides}\n"
    cp = subprocess.run(["dpkg-query", "-W", "-f", fmt], capture_output=True,
                        text=True, check=True)
    deps, provides, base = {}, {}, set()
    for line in cp.stdout.splitlines():
        pkg, ess, status, dep, prov = line.split("\t")
        if not status.startswith("ii"):
            continue
        deps[pkg] = dep
        for p in prov.split(","):
            p = p.strip().split(" ")[0]
            if p:
                provides.setdefault(p, []).append(pkg)
        if ess == "yes":
            base.add(pkg)
    lst = subprocess.run(["bash", os.path.join(src, "tools", "deps.sh"), "--list",
                          "build", "s3", "test", "demo", "bench"],
                         capture_output=True, text=True, check=True).stdout.split()
    base.update(lst)
    base.add("apt")
    seen = set()
    pending = list(base)
    while pending:
        p = pending.pop()
        if p in seen:
            continue
        seen.add(p)
        for alt in deps.get(p, "").split(","):
            for d in alt.split("|"):
                d = d.strip().split(" ")[0].split(":")[0]
                if not d:
                    continue
                pending.extend([d] if d in deps else provides.get(d, []))
    return seen, lst


def main():
    src = sys.argv[1]
    if not shutil.which("dpkg-query"):
        print("programs: no dpkg here, nothing to check")
        return 77
    named = {}  # name -> files
    funcs = set()
    files = tracked(src)
    texts = {}
    for f in files:
        p = os.path.join(src, f)
        k = kind(p)
        if not k:
            continue
        try:
            with open(p, encoding="utf-8") as fh:
                texts[f] = (k, fh.read())
        except (OSError, UnicodeDecodeError):
            continue
    for f, (k, text) in texts.items():
        found = []
        if k == "sh":
            cmds, fs = shell_commands(text)
            found += cmds
            funcs |= fs
            body = "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#"))
            found += ABS.findall(body)
        elif k == "py":
            try:
                tree = ast.parse(text, f)
            except SyntaxError:
                continue
            found += py_programs(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and ABS.fullmatch(node.value):
                    found.append(node.value)
        else:
            found += re.findall(r"find_program\(\s*'([^']+)'", text)
        for name in found:
            named.setdefault(name, set()).add(f)
    progs = {}
    for name, where in named.items():
        # all capitals: an HTTP method (["GET", url]), not a program
        if name in funcs or name in KEYWORDS or name.isupper():
            continue
        path = resolve(name)
        if path:
            progs.setdefault(path, set()).update(where)
    own = owners(sorted(progs))
    ok_pkgs, listed = allowed(src)
    bad = 0
    for path in sorted(progs):
        pkg = own[path]
        if pkg and pkg in ok_pkgs:
            continue
        where = ", ".join(sorted(progs[path])[:4])
        if pkg:
            print("%s (package %s) is run by %s, but neither essential nor "
                  "installed by tools/deps.sh" % (path, pkg, where))
        else:
            print("%s is run by %s, and comes from no Debian package" % (path, where))
        bad += 1
    print("programs: %d programs named, %d from outside the essential set and "
          "tools/deps.sh (%d packages listed there)" % (len(progs), bad, len(listed)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
