// LangChain.js: ChatOpenAI streaming, then a tool call bound with bindTools.
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const chat = new ChatOpenAI({
    model: MODEL,
    apiKey: GATEWAY_KEY,
    maxRetries: 0,
    configuration: { baseURL: BASE_URL },
  });
  let text = "";
  for await (const chunk of await chat.stream("Capital of the UK?")) {
    text += chunk.content;
  }
  const weather = {
    name: "weather",
    description: "The weather in a city",
    schema: z.object({ city: z.string() }),
  };
  const message = await chat.bindTools([weather]).invoke("Weather in Paris?");
  return { text, toolCalls: message.tool_calls.map((c) => [c.name, c.args]) };
});
