// The module lives once, in gateway/web/ (the page loads it from there):
// `npm pack` copies it in beside its declarations and removes the copy after,
// so the package and the page never diverge.
import fs from 'node:fs';
const here = new URL('./im_sync_client.js', import.meta.url);
if (process.argv[2] === 'copy') fs.copyFileSync(new URL('../web/im_sync_client.js', import.meta.url), here);
else fs.rmSync(here, { force: true });
