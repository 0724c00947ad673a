import type {
	IDataObject,
	IExecuteFunctions,
	ILoadOptionsFunctions,
	INodeExecutionData,
	INodePropertyOptions,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeApiError, NodeConnectionTypes, NodeOperationError, sleep } from 'n8n-workflow';

import { fieldProperties, operationProperties, resourceProperty } from './description';
import { keep, spend } from './handoffs';
import { credentials, redact, werkDownload, werkRequest } from './transport';

const JOB_STAGES = ['queued', 'loading', 'running', 'encoding', 'completed'];
const POLL_MS = 250;
const JOB_TIMEOUT_MS = 3_600_000;

type Run = (ctx: IExecuteFunctions, i: number) => Promise<INodeExecutionData[]>;

function messages(ctx: IExecuteFunctions, i: number): IDataObject[] {
	const system = ctx.getNodeParameter('system', i, '') as string;
	const prompt = ctx.getNodeParameter('prompt', i) as string;
	return [
		...(system.trim() ? [{ role: 'system', content: system }] : []),
		{ role: 'user', content: prompt },
	];
}

function generation(ctx: IExecuteFunctions, i: number): IDataObject {
	const options = ctx.getNodeParameter('options', i, {}) as IDataObject;
	const body: IDataObject = {
		max_tokens: (options.maxTokens as number | undefined) ?? 256,
		temperature: (options.temperature as number | undefined) ?? 0,
	};
	if (options.seed !== undefined) body.seed = options.seed;
	const stop = String(options.stop ?? '')
		.split(',')
		.map((s) => s.trim())
		.filter((s) => s);
	if (stop.length) body.stop = stop.slice(0, 16);
	return body;
}

/** One item per entry of a Werk listing, filtered by the model the parameter names (if any). */
async function listing(
	ctx: IExecuteFunctions,
	i: number,
	filterParameter: string,
	path: string,
	key: string,
): Promise<INodeExecutionData[]> {
	const model = ctx.getNodeParameter(filterParameter, i, '') as string;
	const answer = await werkRequest(ctx, 'GET', path, undefined, model ? { model } : undefined);
	return ((answer[key] as IDataObject[]) ?? []).map((entry) => ({ json: entry }));
}

async function optIn(ctx: IExecuteFunctions): Promise<boolean> {
	return Boolean((await credentials(ctx)).allowExperimental);
}

const run: Record<string, Record<string, Run>> = {
	chat: {
		async complete(ctx, i) {
			const model = ctx.getNodeParameter('model', i) as string;
			const body = { model, messages: messages(ctx, i), stream: false, ...generation(ctx, i) };
			const answer = await werkRequest(ctx, 'POST', '/v1/chat/completions', body);
			const choice = ((answer.choices as IDataObject[]) ?? [])[0] ?? {};
			const message = (choice.message as IDataObject) ?? {};
			return [
				{
					json: {
						text: String(message.content ?? ''),
						model,
						finish_reason: choice.finish_reason ?? null,
						usage: answer.usage ?? null,
					},
				},
			];
		},
	},
	state: {
		async prefill(ctx, i) {
			const model = ctx.getNodeParameter('model', i) as string;
			const policy = ctx.getNodeParameter('policy', i, {}) as IDataObject;
			const body = {
				model,
				messages: messages(ctx, i),
				policy: {
					retention: policy.retention ?? 'ephemeral',
					reuse: policy.reuse ?? 'disabled',
					ttl_seconds: policy.ttlSeconds ? policy.ttlSeconds : null,
					pin: Boolean(policy.pin),
				},
				allow_experimental: await optIn(ctx),
			};
			const answer = await werkRequest(ctx, 'POST', '/werk/v1/prefill', body);
			const handoff = answer.handoff as IDataObject;
			const ref = keep(String(handoff.token), String(handoff.expires_at));
			return [
				{
					json: {
						handoff: { ref, model, expires_at: handoff.expires_at },
						state: answer.state ?? null,
						reuse: answer.reuse ?? null,
						usage: answer.usage ?? null,
					},
				},
			];
		},
		async decode(ctx, i) {
			const ref = String(ctx.getNodeParameter('handoff', i) ?? '');
			const token = spend(ref);
			if (token === undefined) {
				throw new NodeOperationError(
					ctx.getNode(),
					'This handoff is unknown, expired or already used: a handoff is single-use. Run the Prefill again.',
					{ itemIndex: i },
				);
			}
			const body = { handoff: token, ...generation(ctx, i) };
			const answer = await werkRequest(ctx, 'POST', '/werk/v1/decode', body);
			return [
				{
					json: {
						text: answer.text,
						finish_reason: answer.finish_reason,
						usage: answer.usage ?? null,
					},
				},
			];
		},
		async getAll(ctx, i) {
			return listing(ctx, i, 'modelFilter', '/werk/v1/states', 'states');
		},
		async pin(ctx, i) {
			const id = encodeURIComponent(ctx.getNodeParameter('stateId', i) as string);
			const body = {
				pinned: ctx.getNodeParameter('pinned', i) as boolean,
				dry_run: ctx.getNodeParameter('dryRun', i) as boolean,
			};
			return [{ json: await werkRequest(ctx, 'POST', `/werk/v1/states/${id}/pin`, body) }];
		},
		async prune(ctx, i) {
			const ids = (ctx.getNodeParameter('stateIds', i, '') as string)
				.split(',')
				.map((s) => s.trim())
				.filter((s) => s);
			const dryRun = ctx.getNodeParameter('dryRun', i) as boolean;
			let body: IDataObject;
			if (ids.length) {
				body = { ids, dry_run: dryRun };
			} else {
				const given = ctx.getNodeParameter('filter', i, {}) as IDataObject;
				const filter: IDataObject = {};
				if (given.model) filter.model = given.model;
				if (given.olderThanSeconds) filter.older_than_seconds = given.olderThanSeconds;
				if (given.expired) filter.expired = true;
				if (!Object.keys(filter).length) {
					throw new NodeOperationError(ctx.getNode(), 'Name state IDs or set a filter', {
						itemIndex: i,
					});
				}
				body = { filter, dry_run: dryRun };
			}
			return [{ json: await werkRequest(ctx, 'POST', '/werk/v1/states/prune', body) }];
		},
	},
	speech: {
		async create(ctx, i) {
			const model = ctx.getNodeParameter('model', i) as string;
			const request: IDataObject = {
				model,
				input: ctx.getNodeParameter('input', i) as string,
				seed: ctx.getNodeParameter('seed', i, 0) as number,
			};
			const voice = (ctx.getNodeParameter('voice', i, '') as string).trim();
			if (voice) request.voice = voice;
			let job = await werkRequest(ctx, 'POST', '/v1/jobs', { kind: 'audio.speech', request });
			const path = `/v1/jobs/${encodeURIComponent(String(job.id))}`;
			const deadline = Date.now() + JOB_TIMEOUT_MS;
			while (job.status !== 'completed') {
				if (job.status === 'failed' || job.status === 'cancelled') {
					const error = (job.error as IDataObject) ?? {};
					throw new NodeOperationError(
						ctx.getNode(),
						redact(`The speech job ${job.id} ${job.status}: ${error.message ?? job.status}`),
						{ itemIndex: i },
					);
				}
				if (!JOB_STAGES.includes(String(job.status)) || Date.now() > deadline) {
					await werkRequest(ctx, 'DELETE', path);
					throw new NodeOperationError(ctx.getNode(), `The speech job ${job.id} did not end`, {
						itemIndex: i,
					});
				}
				await sleep(POLL_MS);
				job = await werkRequest(ctx, 'GET', path);
			}
			const output = job.output as IDataObject;
			const wav = await werkDownload(ctx, String(output.url));
			const field = ctx.getNodeParameter('binaryPropertyName', i) as string;
			const binary = await ctx.helpers.prepareBinaryData(wav, 'speech.wav', 'audio/wav');
			return [
				{
					json: { job: job.id, model, bytes: wav.length, content_type: 'audio/wav' },
					binary: { [field]: binary },
				},
			];
		},
	},
	image: {
		async generate(ctx, i) {
			const model = ctx.getNodeParameter('model', i) as string;
			const options = ctx.getNodeParameter('imageOptions', i, {}) as IDataObject;
			const body: IDataObject = {
				model,
				prompt: ctx.getNodeParameter('prompt', i) as string,
				size: `${options.width ?? 512}x${options.height ?? 512}`,
				n: options.n ?? 1,
				steps: options.steps ?? 20,
				guidance_scale: options.guidanceScale ?? 7.5,
				response_format: 'b64_json',
			};
			if (options.seed !== undefined) body.seed = options.seed;
			if (options.negativePrompt) body.negative_prompt = options.negativePrompt;
			const answer = await werkRequest(ctx, 'POST', '/v1/images/generations', body);
			const field = ctx.getNodeParameter('binaryPropertyName', i) as string;
			const items: INodeExecutionData[] = [];
			for (const [index, image] of ((answer.data as IDataObject[]) ?? []).entries()) {
				const png = Buffer.from(String(image.b64_json), 'base64');
				const binary = await ctx.helpers.prepareBinaryData(png, `image-${index}.png`, 'image/png');
				items.push({ json: { model, index, bytes: png.length }, binary: { [field]: binary } });
			}
			return items;
		},
	},
	memory: {
		async get(ctx) {
			return [{ json: await werkRequest(ctx, 'GET', '/werk/v1/memory') }];
		},
	},
	capability: {
		async getAll(ctx, i) {
			return listing(ctx, i, 'capabilityModel', '/werk/v1/capabilities', 'capabilities');
		},
	},
	model: {
		async getAll(ctx) {
			const answer = await werkRequest(ctx, 'GET', '/werk/v1/models');
			return ((answer.models as IDataObject[]) ?? []).map((model) => ({ json: model }));
		},
		async load(ctx, i) {
			const id = encodeURIComponent(ctx.getNodeParameter('model', i) as string);
			return [
				{ json: await werkRequest(ctx, 'POST', `/werk/v1/models/${id}/load`, { dry_run: false }) },
			];
		},
		async unload(ctx, i) {
			const id = encodeURIComponent(ctx.getNodeParameter('model', i) as string);
			return [
				{
					json: await werkRequest(ctx, 'POST', `/werk/v1/models/${id}/unload`, { dry_run: false }),
				},
			];
		},
	},
	expert: {
		async getAll(ctx, i) {
			await requireOptIn(ctx, i);
			const model = ctx.getNodeParameter('model', i) as string;
			return [{ json: await werkRequest(ctx, 'GET', '/werk/v1/experts', undefined, { model }) }];
		},
		async prefetch(ctx, i) {
			return moveExperts(ctx, i, 'prefetch');
		},
		async evict(ctx, i) {
			return moveExperts(ctx, i, 'evict');
		},
	},
};

async function requireOptIn(ctx: IExecuteFunctions, i: number): Promise<void> {
	if (!(await optIn(ctx))) {
		throw new NodeOperationError(
			ctx.getNode(),
			'Expert operations are experimental: turn on "Allow Experimental" in the Werk credential',
			{ itemIndex: i },
		);
	}
}

async function moveExperts(
	ctx: IExecuteFunctions,
	i: number,
	action: 'prefetch' | 'evict',
): Promise<INodeExecutionData[]> {
	await requireOptIn(ctx, i);
	const model = encodeURIComponent(ctx.getNodeParameter('model', i) as string);
	const experts = (ctx.getNodeParameter('experts', i) as string)
		.split(',')
		.map((s) => s.trim())
		.filter((s) => s);
	const body = {
		experts,
		target: ctx.getNodeParameter('target', i) as string,
		dry_run: ctx.getNodeParameter('dryRun', i) as boolean,
		allow_experimental: true,
	};
	return [{ json: await werkRequest(ctx, 'POST', `/werk/v1/experts/${model}/${action}`, body) }];
}

export class Werk implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk',
		name: 'werk',
		icon: { light: 'file:../../icons/werk.svg', dark: 'file:../../icons/werk.dark.svg' },
		group: ['transform'],
		version: [1],
		subtitle: '={{$parameter["operation"] + ": " + $parameter["resource"]}}',
		description:
			'Chat, prefill/decode, named states, speech, images and memory of a local Werk server',
		defaults: { name: 'Werk' },
		inputs: [NodeConnectionTypes.Main],
		outputs: [NodeConnectionTypes.Main],
		usableAsTool: true,
		credentials: [{ name: 'werkApi', required: true }],
		properties: [resourceProperty, ...operationProperties, ...fieldProperties],
	};

	methods = {
		loadOptions: {
			async getModels(this: ILoadOptionsFunctions): Promise<INodePropertyOptions[]> {
				const answer = await werkRequest(this, 'GET', '/werk/v1/models');
				return ((answer.models as IDataObject[]) ?? []).map((model) => ({
					name: `${model.id} (${model.backend})`,
					value: String(model.id),
				}));
			},
			async getExpertOperations(this: ILoadOptionsFunctions): Promise<INodePropertyOptions[]> {
				if (!(await credentials(this)).allowExperimental) return [];
				return [
					{ name: 'Evict', value: 'evict', description: 'Evict experts from a memory tier' },
					{
						name: 'Get Many',
						value: 'getAll',
						description: 'The experts of a model and their tiers',
					},
					{ name: 'Prefetch', value: 'prefetch', description: 'Move experts into a memory tier' },
				];
			},
		},
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const out: INodeExecutionData[] = [];
		for (let i = 0; i < items.length; i++) {
			const resource = this.getNodeParameter('resource', i) as string;
			const operation = this.getNodeParameter('operation', i) as string;
			const handler = run[resource]?.[operation];
			if (!handler) {
				throw new NodeOperationError(this.getNode(), `Unknown operation ${resource}.${operation}`, {
					itemIndex: i,
				});
			}
			let failure: NodeApiError | NodeOperationError | undefined;
			try {
				for (const item of await handler(this, i)) out.push({ ...item, pairedItem: { item: i } });
			} catch (error) {
				if (this.continueOnFail()) {
					out.push({
						json: { error: redact(String((error as Error).message)) },
						pairedItem: { item: i },
					});
					continue;
				}
				failure =
					error instanceof NodeApiError || error instanceof NodeOperationError
						? error
						: new NodeOperationError(this.getNode(), error as Error);
			}
			if (failure) {
				failure.context.itemIndex = i;
				throw failure;
			}
		}
		return [out];
	}
}
