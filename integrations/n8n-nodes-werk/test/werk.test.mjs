// Every operation of the Werk node against a real `werk serve` (WERK_URL, WERK_API_KEY; the
// demo models: `demo` (llama.cpp), `tiny-image`, `tiny-tts`). Run by `make test` through
// tests/integrations/test_n8n_package.py, which starts the server.
//
// `context()` stands for n8n's execution context (n8n itself runs these operations in
// tests/integrations/test_n8n_real.py): parameters, the credential, the Bearer header the
// credential's `authenticate` expression gives (n8n evaluates it; here it is checked to be
// that expression and applied by hand), an HTTP request like n8n's (`json`, `qs`,
// `encoding: 'arraybuffer'`; a failed request throws n8n-workflow's NodeApiError around an
// error carrying the response, as n8n-core does) and prepareBinaryData.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';

const require = createRequire(import.meta.url);
const { Werk } = require('../dist/nodes/Werk/Werk.node.js');
const { WerkApi } = require('../dist/credentials/WerkApi.credentials.js');
const { NodeApiError } = require('n8n-workflow');

const BASE = process.env.WERK_URL;
const KEY = process.env.WERK_API_KEY;
const TOKEN = /wh_[A-Za-z0-9_-]{8,}/;

function context(params, { allowExperimental = true, key = KEY } = {}) {
	const node = { name: 'Werk', type: 'CUSTOM.werk', typeVersion: 1 };
	const creds = { baseUrl: BASE, apiKey: key, allowExperimental };
	const ctx = {
		getInputData: () => [{ json: {} }],
		getNode: () => node,
		continueOnFail: () => false,
		getCredentials: async (name) => {
			assert.equal(name, 'werkApi');
			return creds;
		},
		getNodeParameter(name, _i, fallback) {
			if (name in params) return params[name];
			if (fallback !== undefined) return fallback;
			throw new Error(`no parameter ${name}`);
		},
		helpers: {
			async httpRequestWithAuthentication(name, options) {
				assert.equal(name, 'werkApi');
				const url = new URL(options.url);
				for (const [k, v] of Object.entries(options.qs ?? {})) url.searchParams.set(k, String(v));
				const headers = {};
				const auth = new WerkApi().authenticate.properties.headers.Authorization;
				assert.equal(auth, '={{$credentials.apiKey ? "Bearer " + $credentials.apiKey : ""}}');
				if (creds.apiKey) headers.Authorization = `Bearer ${creds.apiKey}`;
				if (options.body !== undefined) headers['Content-Type'] = 'application/json';
				const answer = await fetch(url, {
					method: options.method,
					headers,
					body: options.body === undefined ? undefined : JSON.stringify(options.body),
				});
				const raw = Buffer.from(await answer.arrayBuffer());
				if (!answer.ok) {
					const failed = new Error(`Request failed with status code ${answer.status}`);
					let data = raw.toString();
					try {
						data = JSON.parse(data);
					} catch {}
					failed.response = { status: answer.status, data };
					throw new NodeApiError(node, failed);
				}
				if (options.encoding === 'arraybuffer')
					return raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length);
				return options.json ? JSON.parse(raw.toString()) : raw.toString();
			},
			async prepareBinaryData(buffer, fileName, mimeType) {
				return {
					data: buffer.toString('base64'),
					fileName,
					mimeType,
					fileSize: String(buffer.length),
				};
			},
		},
	};
	return ctx;
}

async function execute(params, options) {
	const [items] = await new Werk().execute.call(context(params, options));
	return items;
}

async function oneShot(messages, maxTokens) {
	const answer = await fetch(`${BASE}/v1/chat/completions`, {
		method: 'POST',
		headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
		body: JSON.stringify({ model: 'demo', messages, max_tokens: maxTokens, temperature: 0 }),
	});
	assert.equal(answer.status, 200);
	return (await answer.json()).choices[0].message.content;
}

const PROMPT = 'Name three colours of the sea.';

test('chat: complete equals a one-shot chat completion', async () => {
	const [item] = await execute({
		resource: 'chat',
		operation: 'complete',
		model: 'demo',
		system: '',
		prompt: PROMPT,
		options: { maxTokens: 8 },
	});
	assert.equal(item.json.text, await oneShot([{ role: 'user', content: PROMPT }], 8));
	assert.equal(item.json.model, 'demo');
	assert.ok(item.json.usage.completion_tokens > 0);
});

test('state: prefill then decode equals a one-shot completion; the token never appears', async () => {
	const [prefilled] = await execute({
		resource: 'state',
		operation: 'prefill',
		model: 'demo',
		system: 'Be terse.',
		prompt: PROMPT,
		policy: { retention: 'disk', reuse: 'prefer', ttlSeconds: 600, pin: false },
	});
	assert.match(prefilled.json.handoff.ref, /^hr_[0-9a-f]{32}$/);
	assert.ok(!TOKEN.test(JSON.stringify(prefilled)));
	assert.ok(prefilled.json.state.id.startsWith('st_'));
	const decodeParams = {
		resource: 'state',
		operation: 'decode',
		handoff: prefilled.json.handoff.ref,
		options: { maxTokens: 8 },
	};
	const [decoded] = await execute(decodeParams);
	const expected = await oneShot(
		[
			{ role: 'system', content: 'Be terse.' },
			{ role: 'user', content: PROMPT },
		],
		8,
	);
	assert.equal(decoded.json.text, expected);
	assert.ok(!TOKEN.test(JSON.stringify(decoded)));
	// single use: the reference is spent
	await assert.rejects(execute(decodeParams), (error) => {
		assert.match(error.message, /single-use/);
		assert.ok(!TOKEN.test(error.message));
		return true;
	});

	const states = await execute({ resource: 'state', operation: 'getAll', modelFilter: 'demo' });
	assert.ok(states.some((s) => s.json.id === prefilled.json.state.id));
	const [pinPreview] = await execute({
		resource: 'state',
		operation: 'pin',
		stateId: prefilled.json.state.id,
		pinned: true,
		dryRun: true,
	});
	assert.equal(pinPreview.json.dry_run, true);
	assert.equal(pinPreview.json.state.pinned, true);
	const [preview] = await execute({
		resource: 'state',
		operation: 'prune',
		stateIds: prefilled.json.state.id,
		dryRun: true,
	});
	assert.deepEqual(preview.json.selected, [prefilled.json.state.id]);
	assert.deepEqual(preview.json.deleted, []);
	const [pruned] = await execute({
		resource: 'state',
		operation: 'prune',
		stateIds: prefilled.json.state.id,
		dryRun: false,
	});
	assert.deepEqual(pruned.json.deleted, [prefilled.json.state.id]);
	await assert.rejects(
		execute({ resource: 'state', operation: 'prune', stateIds: '', filter: {}, dryRun: true }),
		/Name state IDs or set a filter/,
	);
});

test('state: without the experimental opt-in Werk refuses the prefill with its reason', async () => {
	await assert.rejects(
		execute(
			{
				resource: 'state',
				operation: 'prefill',
				model: 'demo',
				system: '',
				prompt: PROMPT,
				policy: {},
			},
			{ allowExperimental: false },
		),
		(error) => {
			assert.match(error.message, /experimental_opt_in_required/);
			assert.match(error.message, /allow_experimental/);
			return true;
		},
	);
});

test('speech: a polled job gives a WAV file', async () => {
	const [item] = await execute({
		resource: 'speech',
		operation: 'create',
		model: 'tiny-tts',
		input: 'Hello from n8n.',
		voice: '',
		seed: 1,
		binaryPropertyName: 'audio',
	});
	const wav = Buffer.from(item.binary.audio.data, 'base64');
	assert.equal(item.binary.audio.mimeType, 'audio/wav');
	assert.equal(wav.subarray(0, 4).toString(), 'RIFF');
	assert.equal(wav.subarray(8, 12).toString(), 'WAVE');
	assert.equal(item.json.bytes, wav.length);
	assert.match(item.json.job, /^job_/);
});

test('image: one item per image, PNG files', async () => {
	const items = await execute({
		resource: 'image',
		operation: 'generate',
		model: 'tiny-image',
		prompt: 'a red cat',
		imageOptions: { width: 64, height: 48, n: 2, steps: 4, seed: 3 },
		binaryPropertyName: 'data',
	});
	assert.equal(items.length, 2);
	for (const [index, item] of items.entries()) {
		const png = Buffer.from(item.binary.data.data, 'base64');
		assert.equal(png.subarray(1, 4).toString(), 'PNG');
		assert.equal(png.readUInt32BE(16), 64); // IHDR width
		assert.equal(png.readUInt32BE(20), 48); // IHDR height
		assert.equal(item.json.index, index);
		assert.deepEqual(item.pairedItem, { item: 0 });
	}
});

test('memory, capabilities and models', async () => {
	const [memory] = await execute({ resource: 'memory', operation: 'get' });
	assert.ok(['normal', 'soft', 'hard', 'emergency', 'unknown'].includes(memory.json.pressure));
	assert.ok(memory.json.host.total_bytes > 0);
	const rows = await execute({
		resource: 'capability',
		operation: 'getAll',
		capabilityModel: 'demo',
	});
	const statuses = new Set([
		'supported',
		'unsupported',
		'unavailable',
		'experimental',
		'externally_managed',
		'metadata_only',
	]);
	assert.ok(rows.length > 5 && rows.every((r) => statuses.has(r.json.status)));
	const models = await execute({ resource: 'model', operation: 'getAll' });
	assert.deepEqual(models.map((m) => m.json.id).sort(), ['demo', 'tiny-image', 'tiny-tts']);
	const [loaded] = await execute({ resource: 'model', operation: 'load', model: 'demo' });
	assert.deepEqual(loaded.json, { model: 'demo', resident: true });
	const [unloaded] = await execute({ resource: 'model', operation: 'unload', model: 'demo' });
	assert.deepEqual(unloaded.json, { model: 'demo', resident: false });
});

test('experts: offered and sent only with the opt-in', async () => {
	const werk = new Werk();
	const off = context({}, { allowExperimental: false });
	assert.deepEqual(await werk.methods.loadOptions.getExpertOperations.call(off), []);
	const on = context({});
	const offered = await werk.methods.loadOptions.getExpertOperations.call(on);
	assert.deepEqual(
		offered.map((o) => o.value),
		['evict', 'getAll', 'prefetch'],
	);
	const params = {
		resource: 'expert',
		operation: 'prefetch',
		model: 'demo',
		experts: '1, 2',
		target: 'ram',
		dryRun: true,
	};
	await assert.rejects(execute(params, { allowExperimental: false }), /Allow Experimental/);
	// llama.cpp moves no experts: Werk's answer, not a node failure of its own
	await assert.rejects(execute(params), (error) => {
		assert.match(error.message, /runtime\.experts\.residency is unsupported/);
		assert.equal(error.httpCode, '501');
		return true;
	});
});

test('models list for the dropdown; a wrong key says so', async () => {
	const werk = new Werk();
	const options = await werk.methods.loadOptions.getModels.call(context({}));
	assert.deepEqual(options.map((o) => o.value).sort(), ['demo', 'tiny-image', 'tiny-tts']);
	await assert.rejects(
		execute({ resource: 'memory', operation: 'get' }, { key: 'not-the-key-000000000000' }),
		/unauthenticated/,
	);
});

test('chat model: the model it supplies answers through Werk', async () => {
	const { WerkChatModel } = require('../dist/nodes/WerkChatModel/WerkChatModel.node.js');
	const ctx = context({ model: 'demo', options: { maxTokens: 8, temperature: 0 } });
	// What n8n's SDK asks of the context besides the node's own calls: the egress filter
	// (n8n's SSRF guard; 'disabled' here) and the run log its tracing writes.
	const logged = [];
	ctx.helpers.getSecureEgressFilter = () => 'disabled';
	ctx.addInputData = (type, data) => logged.push(['input', type, data]) && { index: 0 };
	ctx.addOutputData = (type, index, data) => logged.push(['output', type, data]);
	ctx.logger = { debug() {}, info() {}, warn() {}, error() {} };
	const { response } = await new WerkChatModel().supplyData.call(ctx, 0);
	const answer = await response.invoke(PROMPT);
	assert.equal(answer.content, await oneShot([{ role: 'user', content: PROMPT }], 8));
	assert.deepEqual(
		logged.map(([kind, type]) => [kind, type]),
		[
			['input', 'ai_languageModel'],
			['output', 'ai_languageModel'],
		],
	);
	assert.ok(!TOKEN.test(JSON.stringify(answer)));
});
