import type {
	INodeType,
	INodeTypeDescription,
	ISupplyDataFunctions,
	SupplyData,
} from 'n8n-workflow';
import { NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';

import { credentials } from '../Werk/transport';

type ModelOptions = {
	maxTokens?: number;
	temperature?: number;
};

/**
 * A chat model for n8n's AI nodes (AI Agent, Basic LLM Chain, …): a Werk model through Werk's
 * OpenAI-compatible `/v1`. It is built by n8n's AI node SDK (`supplyModel`), which n8n ships
 * from 2.16 on; it is loaded only when the model is used, so the Werk node keeps working in an
 * older n8n, and this node then says what it needs.
 */
export class WerkChatModel implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Chat Model',
		name: 'werkChatModel',
		icon: { light: 'file:../../icons/werk.svg', dark: 'file:../../icons/werk.dark.svg' },
		group: ['transform'],
		version: [1],
		subtitle: '={{$parameter["model"]}}',
		description: 'A chat model served by Werk, for AI Agents and chains',
		defaults: {
			name: 'Werk Chat Model',
		},
		codex: {
			categories: ['AI'],
			subcategories: {
				AI: ['Language Models', 'Root Nodes'],
				'Language Models': ['Chat Models (Recommended)'],
			},
			resources: {
				primaryDocumentation: [
					{ url: 'https://github.com/werk-ai/werk/blob/main/docs/integrations.md#n8n' },
				],
			},
		},
		inputs: [],
		outputs: [NodeConnectionTypes.AiLanguageModel],
		outputNames: ['Model'],
		credentials: [
			{
				name: 'werkApi',
				required: true,
			},
		],
		properties: [
			{
				displayName: 'Model',
				name: 'model',
				type: 'string',
				default: '',
				required: true,
				description: 'The ID of a chat model Werk serves (Werk node → Model → Get Many lists them)',
			},
			{
				displayName: 'Options',
				name: 'options',
				placeholder: 'Add Option',
				description: 'Additional options to add',
				type: 'collection',
				default: {},
				options: [
					{
						displayName: 'Max Tokens',
						name: 'maxTokens',
						default: 256,
						typeOptions: { minValue: 1, maxValue: 65536 },
						description: 'The most tokens to generate per answer',
						type: 'number',
					},
					{
						displayName: 'Sampling Temperature',
						name: 'temperature',
						default: 0.7,
						typeOptions: { maxValue: 2, minValue: 0, numberPrecision: 2 },
						description: '0 for greedy decoding',
						type: 'number',
					},
				],
			},
		],
	};

	async supplyData(this: ISupplyDataFunctions, itemIndex: number): Promise<SupplyData> {
		const werk = await credentials(this);
		const model = this.getNodeParameter('model', itemIndex) as string;
		const options = this.getNodeParameter('options', itemIndex, {}) as ModelOptions;
		let sdk: typeof import('@n8n/ai-node-sdk');
		try {
			sdk = await import('@n8n/ai-node-sdk');
		} catch {
			throw new NodeOperationError(
				this.getNode(),
				'Werk Chat Model needs n8n 2.16 or newer (its AI node SDK); the Werk node works in this n8n',
			);
		}
		// The SDK is typed against its own n8n-workflow; at run time n8n gives one of each.
		type SdkContext = Parameters<typeof sdk.supplyModel>[0];
		const supplied = sdk.supplyModel(this as unknown as SdkContext, {
			type: 'openai',
			baseUrl: `${werk.baseUrl}/v1`,
			apiKey: werk.apiKey || 'none',
			model,
			temperature: options.temperature,
			maxTokens: options.maxTokens,
		});
		return supplied as unknown as SupplyData;
	}
}
