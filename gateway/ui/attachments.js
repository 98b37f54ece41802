// The gateway's admin UI: what a user sent besides text, as it looked (an ES module of the page;
// no build step). A message's content parts, in the chat shape every dialect is recorded in
// (an Anthropic `image` or a Responses `input_image` became an `image_url`), and the others'
// own shapes where a client's history kept them: text as text, images as thumbnails that open
// full size with their detail and size, audio and files as labelled attachments.
//
// An image sent as a data URL is shown at once (it is in the record); one sent as a remote URL
// is loaded only when asked: loading it tells that server who looked, and when.

import { h } from './dom.js';
import { fmtInt } from './format.js';

export function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined) return null;
  if (bytes < 1000) return `${fmtInt(bytes)} B`;
  if (bytes < 1e6) return `${(bytes / 1e3).toFixed(1)} kB`;
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

function dataUrl(url) {
  // `data:<type>;base64,<data>`: its media type and decoded size.
  const match = /^data:([^;,]*)(;base64)?,/.exec(url || '');
  if (!match) return null;
  const body = url.length - match[0].length;
  const padding = url.endsWith('==') ? 2 : url.endsWith('=') ? 1 : 0;
  return {
    type: match[1] || 'text/plain',
    bytes: match[2] ? Math.floor((body * 3) / 4) - padding : body,
  };
}

function base64Bytes(data) {
  if (typeof data !== 'string') return null;
  const padding = data.endsWith('==') ? 2 : data.endsWith('=') ? 1 : 0;
  return Math.floor((data.length * 3) / 4) - padding;
}

function hostOf(url) {
  try {
    return new URL(url).host;
  } catch {
    return url;
  }
}

function openFull(img, caption) {
  // The image at its own size, in a modal dialog (a data URL cannot be opened in a tab).
  const dialog = h(
    'dialog',
    {
      class: 'popover image-dialog',
      'aria-label': `Image: ${caption}`,
      'data-testid': 'image-full',
    },
    h('img', { src: img.src, alt: img.alt, class: 'image-full' }),
    h('p', { class: 'muted', text: caption }),
    h('button', { class: 'btn btn-small', type: 'button', onclick: () => dialog.close() }, 'Close'),
  );
  dialog.addEventListener('close', () => dialog.remove());
  dialog.addEventListener('click', (event) => {
    if (event.target === dialog) dialog.close(); // a click outside the image
  });
  document.body.append(dialog);
  dialog.showModal();
}

function imagePart(url, detail) {
  const data = dataUrl(url);
  const facts = h('span', { class: 'attachment-facts', 'data-testid': 'image-facts' });
  const describe = (pixels) => {
    facts.textContent = [
      data ? data.type.replace(/^image\//, '').toUpperCase() : hostOf(url),
      data ? fmtBytes(data.bytes) : null,
      pixels,
      `detail: ${detail || 'auto'}`,
    ]
      .filter(Boolean)
      .join(' · ');
  };
  describe(null);
  const img = h('img', {
    class: 'thumb',
    alt: 'Image the user sent',
    'data-testid': 'image-thumb',
    decoding: 'async',
  });
  img.addEventListener('load', () => describe(`${img.naturalWidth}×${img.naturalHeight}`));
  const figure = h('figure', {
    class: 'attachment attachment-image',
    'data-testid': 'image-attachment',
  });
  const open = h('button', { class: 'thumb-button', type: 'button', title: 'Open full size' }, img);
  open.addEventListener('click', () => openFull(img, facts.textContent));
  if (data) {
    img.src = url;
    figure.append(open, h('figcaption', {}, facts));
    return figure;
  }
  // Remote: a link to it, and a thumbnail once asked for.
  const show = h(
    'button',
    { class: 'btn btn-small', type: 'button', 'data-testid': 'load-remote-image' },
    `Show image from ${hostOf(url)}`,
  );
  show.addEventListener('click', () => {
    img.src = url;
    show.replaceWith(open);
  });
  figure.append(
    show,
    h(
      'figcaption',
      {},
      facts,
      ' ',
      h(
        'a',
        { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'attachment-link' },
        'open full size',
      ),
    ),
  );
  return figure;
}

function attachment(kind, name, facts) {
  return h(
    'div',
    { class: 'attachment attachment-file', 'data-testid': `${kind.toLowerCase()}-attachment` },
    h('span', { class: 'attachment-kind', text: kind }),
    name ? h('span', { class: 'attachment-name', text: name }) : null,
    h('span', { class: 'attachment-facts', text: facts.filter(Boolean).join(' · ') }),
  );
}

function part(p) {
  if (typeof p === 'string') return h('div', { class: 'msg-text', text: p });
  if (!p || typeof p !== 'object') return null;
  const kind = p.type;
  if (kind === 'text' || kind === 'input_text')
    return h('div', { class: 'msg-text', text: p.text || '' });
  if (kind === 'image_url') {
    const image = typeof p.image_url === 'string' ? { url: p.image_url } : p.image_url || {};
    return imagePart(image.url, image.detail);
  }
  if (kind === 'input_image' && p.image_url) return imagePart(p.image_url, p.detail);
  if (kind === 'image' && p.source) {
    const source = p.source;
    const url =
      source.type === 'base64' ? `data:${source.media_type};base64,${source.data}` : source.url;
    return url ? imagePart(url, null) : attachment('Image', source.file_id, []);
  }
  if (kind === 'input_audio') {
    const audio = p.input_audio || {};
    return attachment('Audio', null, [audio.format, fmtBytes(base64Bytes(audio.data))]);
  }
  if (kind === 'file' || kind === 'input_file' || kind === 'document') {
    const file = p.file || p.source || p;
    const data = file.file_data || file.data;
    const inline = dataUrl(data);
    return attachment('File', file.filename || file.title || file.file_id || null, [
      inline ? inline.type : file.media_type,
      inline ? fmtBytes(inline.bytes) : fmtBytes(base64Bytes(data)),
      file.file_id && file.filename ? file.file_id : null,
    ]);
  }
  return attachment(kind || 'Part', null, ['not shown']);
}

export function userContent(content) {
  // A user message's content: its text, or each of its parts in order.
  if (!Array.isArray(content)) {
    return h('div', {
      class: 'msg-text',
      text: content === null || content === undefined ? '' : String(content),
    });
  }
  return h('div', { class: 'msg-parts' }, content.map(part));
}
