// The web client's mount (contract §16): files of the web folder are served
// with a Content-Security-Policy, and nothing outside it ever is: "..",
// encoded "%2e%2e", absolute paths and symlinks pointing out all get 404.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Gateway, TMP } from './harness.mjs';

const root = path.join(TMP, `webroot-${process.pid}`);
const outside = path.join(TMP, `outside-${process.pid}`);
const SECRET = 'SECRET-outside-the-web-root';
const gw = new Gateway();

before(async () => {
  fs.mkdirSync(path.join(root, 'web'), { recursive: true });
  fs.mkdirSync(outside, { recursive: true });
  fs.writeFileSync(path.join(outside, 'secret.txt'), SECRET);
  fs.writeFileSync(path.join(root, 'secret.txt'), SECRET);           // beside the folder
  for (const f of ['index.html', 'app.js', 'app.css', 'im_sync_client.js']) {
    fs.copyFileSync(new URL(`../../gateway/web/${f}`, import.meta.url), path.join(root, 'web', f));
  }
  fs.symlinkSync(path.join(outside, 'secret.txt'), path.join(root, 'web', 'link.txt'));
  fs.symlinkSync(outside, path.join(root, 'web', 'linkdir'));
  fs.symlinkSync(path.join(root, 'web', 'app.css'), path.join(root, 'web', 'inside.css'));
  await gw.start(['--web-root', path.join(root, 'web')]);
});
after(() => gw.stop());

// A raw request, so no client library normalizes the path first.
function raw(target) {
  return new Promise((resolve, reject) => {
    const s = net.connect(gw.port, '127.0.0.1');
    let data = '';
    s.on('connect', () => s.write(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nConnection: close\r\n\r\n`));
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('end', () => resolve({ status: Number(data.split(' ')[1]), text: data }));
    s.on('error', reject);
  });
}

test('the page and the module are served with a Content-Security-Policy; GET / leads to them', async () => {
  const r = await fetch(gw.httpUrl, { redirect: 'manual' });
  assert.equal(r.status, 302);
  assert.match(r.headers.get('location'), /\/web\/$/);
  const page = await fetch(gw.httpUrl + 'web/');
  assert.equal(page.status, 200);
  assert.match(await page.text(), /<script type="module" src="app.js">/);
  const csp = page.headers.get('content-security-policy');
  assert.match(csp, /script-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  const js = await fetch(gw.httpUrl + 'web/im_sync_client.js');
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /javascript/);
  assert.equal((await fetch(gw.httpUrl + 'web/inside.css')).status, 200);   // a link inside is fine
});

test('nothing outside the folder: .., %2e%2e, absolute paths, symlinks', async () => {
  const attempts = [
    '/web/../secret.txt', '/web/../../secret.txt', '/web/%2e%2e/secret.txt', '/web/%2E%2E/secret.txt',
    '/web/..%2fsecret.txt', '/web/%2e%2e%2fsecret.txt', '/web/.%2e/secret.txt', '/web/..\\secret.txt',
    `/web/${path.join(outside, 'secret.txt')}`, `/web//${path.join(outside, 'secret.txt')}`,
    path.join(outside, 'secret.txt'), `/web/%2f${outside.slice(1)}/secret.txt`,
    '/web/link.txt', '/web/linkdir/secret.txt', '/web/../../../../../../etc/passwd', '/secret.txt',
    '/web/%00../secret.txt', '/web/package.json', '/package.json', '/web/../package.json',
  ];
  for (const a of attempts) {
    const r = await raw(a);
    assert.ok(!r.text.includes(SECRET) && !r.text.includes('root:x:0:0') && !r.text.includes('"puppeteer-core"'),
              `${a} leaked: ${r.text.slice(0, 200)}`);
    assert.ok(r.status >= 400 || r.status === 301 || r.status === 302, `${a}: status ${r.status}`);
  }
});

// gateway/web/ is mounted as it is, so it holds exactly what the page loads:
// the files index.html names and the modules they import, nothing else (the
// command-line client and the npm packages live outside it).
test('gateway/web holds exactly the page and what it loads', () => {
  const web = new URL('../../gateway/web/', import.meta.url);
  const loaded = new Set(['index.html']);
  const todo = ['index.html'];
  while (todo.length) {
    const f = todo.pop();
    const text = fs.readFileSync(new URL(f, web), 'utf8');
    const refs = f.endsWith('.html')
      ? [...text.matchAll(/\b(?:src|href)="([^"]+)"/g)].map((m) => m[1])
      : [...text.matchAll(/^import\b[^'"]*['"](\.\/[^'"]+)['"]/gm)].map((m) => m[1]);
    for (const r of refs) {
      const name = r.replace(/^\.\//, '');
      if (!loaded.has(name)) { loaded.add(name); todo.push(name); }
    }
  }
  assert.deepEqual(fs.readdirSync(web).sort(), [...loaded].sort());
});
