#!/usr/bin/env python3
"""The SQL policy of extension/doc/upgrades.md, checked on the tree.

1. The current catalogs (extension/schema/*.sql, extension/router/schema/*.sql)
   create every object once, in its final form.  A statement there is one of
       CREATE ...                  (not CREATE OR REPLACE: a second definition
                                    of an object is history, not a catalog)
       COMMENT ON ... / GRANT ... / REVOKE ...
       SELECT pg_catalog.pg_extension_config_dump(...)
       INSERT ...                  (an initial row, e.g. the router's state row)
       ALTER ... OWNER TO ...
       ALTER TABLE t ENABLE ALWAYS|REPLICA TRIGGER tg
       DO $$ ... $$                (its body under the same rules: it may
                                    REVOKE or GRANT in a loop, hand over an
                                    owner, but never DROP, ALTER otherwise,
                                    UPDATE, DELETE or TRUNCATE)
   and never a DROP, any other ALTER (one that changes a definition: ADD or
   DROP of a column or constraint, SET DEFAULT, ALTER FUNCTION ... SECURITY
   DEFINER, ...), UPDATE, DELETE, TRUNCATE or a psql meta-command (the
   generated script's first line is make's).  Function bodies are not
   statements run by the install and are not read.
2. Released scripts never change: for each release in test/upgrade/releases.txt
   and router_releases.txt, every script its commit holds for a version up to
   that release is byte-identical to the file of that name in updates/, where
   it still exists (only the base keeps a full script).
3. updates/ holds one full script (the base) and upgrades A--B; the generated
   install script of the current version is not committed, and updates/
   leads from the base to the current version.
Exit status 1 and one line per finding when any rule is broken.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
findings = []


def fail(msg):
    findings.append(msg)


def statements(text):
    """Top-level statements of a SQL file as lists of tokens (word,
    punctuation or whole string/quoted identifier), comments dropped, with
    the line each starts on."""
    out, cur, i, n, line, start = [], [], 0, len(text), 1, None
    while i < n:
        c = text[i]
        if c == '\n':
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        if start is None:
            start = line
        if text.startswith('--', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
            if not cur:
                start = None
            continue
        if text.startswith('/*', i):        # nested, as PostgreSQL reads them
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif text.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if depth:
                raise ValueError('unterminated /* comment at line %d' % line)
            line += text.count('\n', i, j)
            i = j
            if not cur:
                start = None
            continue
        if c == '\\' and not cur:
            j = text.find('\n', i)
            j = n if j < 0 else j
            cur.append(('meta', text[i:j]))
            i = j
            out.append((start, cur))
            cur, start = [], None
            continue
        m = re.match(r'\$([A-Za-z_][A-Za-z_0-9]*)?\$', text[i:])
        if m:
            tag = m.group(0)
            j = text.find(tag, i + len(tag))
            if j < 0:
                raise ValueError('unterminated %s string at line %d' % (tag, line))
            cur.append(('str', text[i + len(tag):j]))
            line += text.count('\n', i, j)
            i = j + len(tag)
            continue
        if c in "'\"" or (c in 'eE' and text.startswith("'", i + 1)):
            q = '"' if c == '"' else "'"
            backslash = c in 'eE'
            j = i + (2 if backslash else 1)
            while j < n:
                if backslash and text[j] == '\\':
                    j += 2
                    continue
                if text[j] == q:
                    if text.startswith(q * 2, j):
                        j += 2
                        continue
                    break
                j += 1
            cur.append(('ident' if q == '"' else 'str', text[i:j + 1]))
            line += text.count('\n', i, j)
            i = j + 1
            continue
        if c == ';':
            if cur:
                out.append((start, cur))
            cur, start = [], None
            i += 1
            continue
        m = re.match(r'[A-Za-z_][A-Za-z_0-9$]*', text[i:])
        if m:
            cur.append(('word', m.group(0).upper()))
            i += len(m.group(0))
            continue
        cur.append(('punct', c))
        i += 1
    if cur:
        out.append((start, cur))
    return out


# what a DO body may not run (EXECUTE'd text included: it is only text here)
DO_FORBIDDEN = [
    (re.compile(r'\bDROP\b', re.I), 'DROP'),
    (re.compile(r'\bTRUNCATE\b', re.I), 'TRUNCATE'),
    (re.compile(r'\bDELETE\s+FROM\b', re.I), 'DELETE'),
    (re.compile(r'\bUPDATE\s+[\w."]+\s+(\w+\s+)?SET\b', re.I), 'UPDATE'),
]
DO_ALTER = re.compile(r'\bALTER\b', re.I)
DO_ALTER_OK = re.compile(r'\bALTER\s+(TABLE|FUNCTION|ROUTINE|PROCEDURE|SEQUENCE|SCHEMA|DOMAIN|TYPE|VIEW)\s+'
                         r'\S+\s+OWNER\s+TO\b', re.I)


def strip_sql_comments(body):
    return re.sub(r'--[^\n]*', '', body)


def check_statement(where, toks):
    words = [v for k, v in toks if k == 'word']
    kinds = [k for k, _ in toks]
    if kinds and kinds[0] == 'meta':
        return fail('%s: psql meta-command %r (make writes the script\'s first line)' % (where, toks[0][1]))
    if not words:
        return fail('%s: a statement without a keyword' % where)
    head = words[0]
    if head == 'CREATE':
        if words[1:3] == ['OR', 'REPLACE']:
            fail('%s: CREATE OR REPLACE (an object is created once, in its final form)' % where)
        return
    if head in ('COMMENT', 'GRANT', 'REVOKE', 'INSERT'):
        return
    if head == 'SELECT':
        if words[1:] == ['PG_CATALOG.PG_EXTENSION_CONFIG_DUMP']:
            return
        return fail('%s: SELECT other than pg_catalog.pg_extension_config_dump(...)' % where)
    if head == 'ALTER':
        if len(words) >= 4 and words[-3:-1] == ['OWNER', 'TO']:
            return
        if (words[1] == 'TABLE' and len(words) == 7 and words[3] == 'ENABLE'
                and words[4] in ('ALWAYS', 'REPLICA') and words[5] == 'TRIGGER'):
            return
        return fail('%s: ALTER %s (changes a definition: write the object in its final form)'
                    % (where, ' '.join(words[1:4])))
    if head == 'DO':
        bodies = [v for k, v in toks if k == 'str']
        if not bodies:
            return fail('%s: DO without a body' % where)
        body = strip_sql_comments(bodies[0])
        for rx, name in DO_FORBIDDEN:
            if rx.search(body):
                fail('%s: DO block runs %s' % (where, name))
        for m in DO_ALTER.finditer(body):
            if not DO_ALTER_OK.match(body, m.start()):
                fail('%s: DO block runs ALTER other than ... OWNER TO: %r'
                     % (where, body[m.start():m.start() + 60].split('\n')[0]))
        return
    fail('%s: %s statement (a catalog source only creates; data and history go in an upgrade script)'
         % (where, head))


def qualified(toks):
    """ALTER TABLE im.x ENABLE ... reads as words IM X: join a.b names."""
    out, i = [], 0
    while i < len(toks):
        if (toks[i][0] == 'word' and i + 2 < len(toks) and toks[i + 1] == ('punct', '.')
                and toks[i + 2][0] in ('word', 'ident')):
            out.append(('word', toks[i][1] + '.' + toks[i + 2][1].upper()))
            i += 3
            continue
        out.append(toks[i])
        i += 1
    return out


def check_sources(paths):
    for path in paths:
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding='utf-8') as f:
            text = f.read()
        try:
            stmts = statements(text)
        except ValueError as e:
            fail('%s: %s' % (rel, e))
            continue
        if not stmts:
            fail('%s: no statement' % rel)
        for line, toks in stmts:
            check_statement('%s:%d' % (rel, line), qualified(toks))
    return len(paths)


def git(*args):
    return subprocess.run(['git', '-C', ROOT] + list(args), check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout


def vkey(v):
    return tuple(int(x) for x in v.split('.'))


SCRIPT = re.compile(r'^(?P<ext>im_sync(?:_router)?)--(?P<a>[0-9.]+)(?:--(?P<b>[0-9.]+))?\.sql$')


def check_releases(releases, ext, updates_dir):
    compared = []
    lines = [l.split() for l in open(os.path.join(ROOT, releases)) if l.strip() and not l.startswith('#')]
    for version, commit in lines:
        try:
            git('cat-file', '-e', commit + '^{commit}')
        except subprocess.CalledProcessError:
            fail('%s: release commit %s of %s is not in this repository' % (releases, commit, version))
            continue
        for path in git('ls-tree', '-r', '--name-only', commit).split('\n'):
            m = SCRIPT.match(os.path.basename(path))
            if not m or m.group('ext') != ext:
                continue
            target = m.group('b') or m.group('a')
            if vkey(target) > vkey(version):
                continue            # not yet released at that commit
            here = os.path.join(ROOT, updates_dir, os.path.basename(path))
            if not os.path.exists(here):
                continue            # a full script the upgrade suites take from its commit
            released = git('rev-parse', '%s:%s' % (commit, path)).strip()
            now = git('hash-object', here).strip()
            if released != now:
                fail('%s/%s differs from the one released as %s in %s (%s)'
                     % (updates_dir, os.path.basename(path), version, commit[:12], path))
            compared.append((os.path.basename(path), version))
    return compared


def control_version(path):
    m = re.search(r"^default_version = '([^']+)'", open(os.path.join(ROOT, path)).read(), re.M)
    return m.group(1)


def check_updates(ext, updates_dir, control, generated):
    current = control_version(control)
    full, edges = [], {}
    for name in sorted(os.listdir(os.path.join(ROOT, updates_dir))):
        m = SCRIPT.match(name)
        if not m or m.group('ext') != ext:
            fail('%s/%s: not a script of %s' % (updates_dir, name, ext))
            continue
        if m.group('b'):
            edges.setdefault(m.group('a'), []).append(m.group('b'))
        else:
            full.append(m.group('a'))
    if len(full) != 1:
        fail('%s: %d full scripts (%s); only the frozen base belongs here'
             % (updates_dir, len(full), ', '.join(full) or 'none'))
        return
    seen, todo = {full[0]}, [full[0]]
    while todo:
        for b in edges.get(todo.pop(), []):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    if current not in seen:
        fail('%s: no chain of upgrades from the base %s to %s (%s)' % (updates_dir, full[0], current, control))
    tracked = git('ls-files', generated % current).strip()
    if tracked:
        fail('%s is committed; it is generated by make from schema/' % tracked)


def main():
    import glob
    node = sorted(glob.glob(os.path.join(ROOT, 'extension/schema/*.sql')))
    router = sorted(glob.glob(os.path.join(ROOT, 'extension/router/schema/*.sql')))
    if len(node) < 2 or not router:
        fail('extension/schema/ or extension/router/schema/ holds no catalog')
    n = check_sources(node) + check_sources(router)
    c1 = check_releases('test/upgrade/releases.txt', 'im_sync', 'extension/updates')
    c2 = check_releases('test/upgrade/router_releases.txt', 'im_sync_router', 'extension/router/updates')
    check_updates('im_sync', 'extension/updates', 'im_sync.control', 'extension/im_sync--%s.sql')
    check_updates('im_sync_router', 'extension/router/updates', 'extension/router/im_sync_router.control',
                  'extension/router/im_sync_router--%s.sql')
    if not c1 or not c2:
        fail('no released script compared (im_sync: %d, router: %d)' % (len(c1), len(c2)))
    for f in findings:
        print('FAIL ' + f)
    if findings:
        return 1
    print('ok   %d catalog source files: no DROP, no definition-changing ALTER, no data change' % n)
    print('ok   released scripts unchanged in updates/: %d comparisons over %d files (im_sync), %d (router)'
          % (len(c1), len({f for f, _ in c1}), len(c2)))
    print('ok   updates/: one frozen base and a chain to the current version; generated scripts not committed')
    return 0


if __name__ == '__main__':
    if len(sys.argv) > 1:           # check the given files as catalog sources only
        check_sources([os.path.abspath(p) for p in sys.argv[1:]])
        for f in findings:
            print('FAIL ' + f)
        sys.exit(1 if findings else 0)
    sys.exit(main())
