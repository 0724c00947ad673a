import type { INodeProperties } from 'n8n-workflow';

const show = (resource: string[], operation?: string[]) => ({
	show: operation ? { resource, operation } : { resource },
});

export const resourceProperty: INodeProperties = {
	displayName: 'Resource',
	name: 'resource',
	type: 'options',
	noDataExpression: true,
	options: [
		{ name: 'Capability', value: 'capability' },
		{ name: 'Chat', value: 'chat' },
		{ name: 'Expert (Experimental)', value: 'expert' },
		{ name: 'Image', value: 'image' },
		{ name: 'Memory', value: 'memory' },
		{ name: 'Model', value: 'model' },
		{ name: 'Speech', value: 'speech' },
		{ name: 'State', value: 'state' },
	],
	default: 'chat',
};

type Operation = { name: string; value: string; action: string; description: string };

const operations = (resource: string, options: Operation[], fallback: string): INodeProperties => ({
	displayName: 'Operation',
	name: 'operation',
	type: 'options',
	noDataExpression: true,
	displayOptions: show([resource]),
	options,
	default: fallback,
});

export const operationProperties: INodeProperties[] = [
	operations(
		'capability',
		[
			{
				name: 'Get Many',
				value: 'getAll',
				action: 'Get capabilities',
				description: 'What each backend can do now, with its status and reason',
			},
		],
		'getAll',
	),
	operations(
		'chat',
		[
			{
				name: 'Complete',
				value: 'complete',
				action: 'Complete a chat',
				description: 'Ask a chat model and get its answer',
			},
		],
		'complete',
	),
	{
		displayName: 'Operation Name or ID',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: show(['expert']),
		typeOptions: { loadOptionsMethod: 'getExpertOperations' },
		default: '',
		description:
			'Offered only when the credential allows experimental capabilities. Choose from the list, or specify an ID using an <a href="https://docs.n8n.io/code/expressions/">expression</a>.',
	},
	operations(
		'image',
		[
			{
				name: 'Generate',
				value: 'generate',
				action: 'Generate images',
				description: 'Text to image with a Werk image model',
			},
		],
		'generate',
	),
	operations(
		'memory',
		[
			{
				name: 'Get',
				value: 'get',
				action: 'Get memory figures',
				description: 'Host and accelerator memory, pressure level, Werk-managed bytes',
			},
		],
		'get',
	),
	operations(
		'model',
		[
			{
				name: 'Get Many',
				value: 'getAll',
				action: 'Get many models',
				description: 'Models Werk serves and whether each is loaded',
			},
			{ name: 'Load', value: 'load', action: 'Load a model', description: 'Start the model now' },
			{
				name: 'Unload',
				value: 'unload',
				action: 'Unload a model',
				description: 'Stop the model and free its memory',
			},
		],
		'getAll',
	),
	operations(
		'speech',
		[
			{
				name: 'Create',
				value: 'create',
				action: 'Create speech',
				description: 'Speak a text (a Werk job, polled to its end) into a WAV file',
			},
		],
		'create',
	),
	operations(
		'state',
		[
			{
				name: 'Decode',
				value: 'decode',
				action: 'Decode a prefilled prompt',
				description: 'Generate from a Prefill handoff (single use)',
			},
			{
				name: 'Get Many',
				value: 'getAll',
				action: 'Get many states',
				description: 'Your named states',
			},
			{
				name: 'Pin',
				value: 'pin',
				action: 'Pin a state',
				description: 'Pin or unpin a named state',
			},
			{
				name: 'Prefill',
				value: 'prefill',
				action: 'Prefill a prompt',
				description: 'Evaluate a prompt now; decode it later, once',
			},
			{
				name: 'Prune',
				value: 'prune',
				action: 'Prune states',
				description: 'Delete named states (a preview unless Dry Run is off)',
			},
		],
		'prefill',
	),
];

const modelField = (resource: string[], operation?: string[]): INodeProperties => ({
	displayName: 'Model Name or ID',
	name: 'model',
	type: 'options',
	typeOptions: { loadOptionsMethod: 'getModels' },
	required: true,
	default: '',
	description:
		'A model Werk serves. Choose from the list, or specify an ID using an <a href="https://docs.n8n.io/code/expressions/">expression</a>.',
	displayOptions: show(resource, operation),
});

const promptFields = (resource: string[], operation?: string[]): INodeProperties[] => [
	{
		displayName: 'System Message',
		name: 'system',
		type: 'string',
		typeOptions: { rows: 2 },
		default: '',
		displayOptions: show(resource, operation),
	},
	{
		displayName: 'Prompt',
		name: 'prompt',
		type: 'string',
		typeOptions: { rows: 4 },
		required: true,
		default: '',
		displayOptions: show(resource, operation),
	},
];

const generation = (resource: string[], operation: string[]): INodeProperties => ({
	displayName: 'Options',
	name: 'options',
	type: 'collection',
	placeholder: 'Add Option',
	default: {},
	displayOptions: show(resource, operation),
	options: [
		{
			displayName: 'Max Tokens',
			name: 'maxTokens',
			type: 'number',
			typeOptions: { minValue: 1, maxValue: 65536 },
			default: 256,
			description: 'The most tokens to generate',
		},
		{
			displayName: 'Seed',
			name: 'seed',
			type: 'number',
			default: 0,
			description: 'The sampling seed',
		},
		{
			displayName: 'Stop Sequences',
			name: 'stop',
			type: 'string',
			default: '',
			description: 'Up to 16 stop sequences, separated by commas',
		},
		{
			displayName: 'Temperature',
			name: 'temperature',
			type: 'number',
			typeOptions: { minValue: 0, maxValue: 2, numberPrecision: 2 },
			default: 0,
			description: '0 for greedy decoding',
		},
	],
});

const binaryField = (resource: string[]): INodeProperties => ({
	displayName: 'Put Output File in Field',
	name: 'binaryPropertyName',
	type: 'string',
	default: 'data',
	required: true,
	description: 'The binary field of the output item that receives the file',
	displayOptions: show(resource),
});

export const fieldProperties: INodeProperties[] = [
	modelField(['chat']),
	...promptFields(['chat']),
	generation(['chat'], ['complete']),

	modelField(['state'], ['prefill']),
	...promptFields(['state'], ['prefill']),
	{
		displayName: 'Policy',
		name: 'policy',
		type: 'collection',
		placeholder: 'Add Policy Field',
		default: {},
		displayOptions: show(['state'], ['prefill']),
		options: [
			{
				displayName: 'Pin',
				name: 'pin',
				type: 'boolean',
				default: false,
				description: 'Whether to keep the state from pruning',
			},
			{
				displayName: 'Retention',
				name: 'retention',
				type: 'options',
				options: [
					{ name: 'Auto', value: 'auto' },
					{ name: 'Disk', value: 'disk', description: 'A named state kept across restarts' },
					{ name: 'Ephemeral', value: 'ephemeral', description: 'Nothing kept beyond the handoff' },
					{ name: 'Memory', value: 'memory' },
				],
				default: 'ephemeral',
			},
			{
				displayName: 'Reuse',
				name: 'reuse',
				type: 'options',
				options: [
					{ name: 'Disabled', value: 'disabled' },
					{
						name: 'Prefer',
						value: 'prefer',
						description: 'Continue a saved state of this prompt (or its longest prefix)',
					},
					{
						name: 'Required',
						value: 'required',
						description: 'Fail unless a saved state is continued',
					},
				],
				default: 'disabled',
			},
			{
				displayName: 'TTL Seconds',
				name: 'ttlSeconds',
				type: 'number',
				typeOptions: { minValue: 0, maxValue: 2592000 },
				default: 0,
				description: 'Expire the state after this many seconds (0: never)',
			},
		],
	},
	{
		displayName: 'Handoff',
		name: 'handoff',
		type: 'string',
		required: true,
		default: '={{ $json.handoff.ref }}',
		description: 'The handoff reference a Prefill output (the token itself never leaves the node)',
		displayOptions: show(['state'], ['decode']),
	},
	generation(['state'], ['decode']),
	{
		displayName: 'Model Filter',
		name: 'modelFilter',
		type: 'string',
		default: '',
		description: 'Only the states of this model (empty: all)',
		displayOptions: show(['state'], ['getAll']),
	},
	{
		displayName: 'State ID',
		name: 'stateId',
		type: 'string',
		required: true,
		default: '',
		displayOptions: show(['state'], ['pin']),
	},
	{
		displayName: 'Pinned',
		name: 'pinned',
		type: 'boolean',
		default: true,
		description: 'Whether the state should be pinned',
		displayOptions: show(['state'], ['pin']),
	},
	{
		displayName: 'State IDs',
		name: 'stateIds',
		type: 'string',
		default: '',
		description: 'States to prune, separated by commas (empty: use the filter below)',
		displayOptions: show(['state'], ['prune']),
	},
	{
		displayName: 'Filter',
		name: 'filter',
		type: 'collection',
		placeholder: 'Add Filter',
		default: {},
		displayOptions: show(['state'], ['prune']),
		options: [
			{
				displayName: 'Expired Only',
				name: 'expired',
				type: 'boolean',
				default: false,
				description: 'Whether to select expired states only',
			},
			{ displayName: 'Model', name: 'model', type: 'string', default: '' },
			{
				displayName: 'Older Than Seconds',
				name: 'olderThanSeconds',
				type: 'number',
				typeOptions: { minValue: 0 },
				default: 0,
			},
		],
	},
	{
		displayName: 'Dry Run',
		name: 'dryRun',
		type: 'boolean',
		default: true,
		description: 'Whether to only preview what would change',
		displayOptions: show(['state', 'expert'], ['pin', 'prune', 'prefetch', 'evict']),
	},

	modelField(['speech']),
	{
		displayName: 'Text',
		name: 'input',
		type: 'string',
		typeOptions: { rows: 3 },
		required: true,
		default: '',
		displayOptions: show(['speech']),
	},
	{
		displayName: 'Voice',
		name: 'voice',
		type: 'string',
		default: '',
		description: 'A speaker of the model (empty: its first)',
		displayOptions: show(['speech']),
	},
	{
		displayName: 'Seed',
		name: 'seed',
		type: 'number',
		default: 0,
		description: 'The same seed gives the same audio',
		displayOptions: show(['speech']),
	},
	binaryField(['speech']),

	modelField(['image']),
	{
		displayName: 'Prompt',
		name: 'prompt',
		type: 'string',
		typeOptions: { rows: 3 },
		required: true,
		default: '',
		displayOptions: show(['image']),
	},
	{
		displayName: 'Options',
		name: 'imageOptions',
		type: 'collection',
		placeholder: 'Add Option',
		default: {},
		displayOptions: show(['image']),
		options: [
			{
				displayName: 'Guidance Scale',
				name: 'guidanceScale',
				type: 'number',
				typeOptions: { minValue: 0, maxValue: 30 },
				default: 7.5,
			},
			{
				displayName: 'Height',
				name: 'height',
				type: 'number',
				typeOptions: { minValue: 8, maxValue: 1024 },
				default: 512,
				description: 'A multiple of 8',
			},
			{
				displayName: 'Images',
				name: 'n',
				type: 'number',
				typeOptions: { minValue: 1, maxValue: 4 },
				default: 1,
				description: 'How many images (one output item each)',
			},
			{ displayName: 'Negative Prompt', name: 'negativePrompt', type: 'string', default: '' },
			{ displayName: 'Seed', name: 'seed', type: 'number', default: 0 },
			{
				displayName: 'Steps',
				name: 'steps',
				type: 'number',
				typeOptions: { minValue: 1, maxValue: 100 },
				default: 20,
			},
			{
				displayName: 'Width',
				name: 'width',
				type: 'number',
				typeOptions: { minValue: 8, maxValue: 1024 },
				default: 512,
				description: 'A multiple of 8',
			},
		],
	},
	binaryField(['image']),

	{
		displayName: 'Model Filter',
		name: 'capabilityModel',
		type: 'string',
		default: '',
		description: 'The rows of this model (empty: every backend)',
		displayOptions: show(['capability']),
	},
	modelField(['model'], ['load', 'unload']),

	modelField(['expert'], ['getAll', 'prefetch', 'evict']),
	{
		displayName: 'Expert IDs',
		name: 'experts',
		type: 'string',
		required: true,
		default: '',
		description: 'Expert IDs, separated by commas',
		displayOptions: show(['expert'], ['prefetch', 'evict']),
	},
	{
		displayName: 'Target Tier',
		name: 'target',
		type: 'options',
		options: [
			{ name: 'RAM', value: 'ram' },
			{ name: 'VRAM', value: 'vram' },
		],
		default: 'ram',
		displayOptions: show(['expert'], ['prefetch', 'evict']),
	},
];
