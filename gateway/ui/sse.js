// Server-sent events read from a fetch response (an ES module of the page; no build step): an
// EventSource cannot send the key. Each frame's event name and data, in order; `onFrame`
// returning true stops the reading.

export async function readEvents(response, onFrame) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const frames = buffer.split(/\r?\n\r?\n/);
    buffer = frames.pop();
    for (const frame of frames) {
      let event = 'message';
      const data = [];
      for (const line of frame.split(/\r?\n/)) {
        if (line.startsWith('event:')) event = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).trim());
      }
      if (data.length && onFrame(event, data.join('\n')) === true) {
        reader.cancel();
        return;
      }
    }
  }
}
